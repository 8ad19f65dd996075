"""ctypes binding of loom's C ABI (include/loom/loom_c.h): the structs, the functions, and the
mapping of status codes to Python exceptions. Nothing here imports torch."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

# Must equal LOOM_ABI_VERSION in include/loom/loom_c.h; checked against the library on load.
ABI_VERSION = 2

LOOM_OK = 0
LOOM_ERROR_INVALID_ARGUMENT = 1
LOOM_ERROR_CUDA = 2
LOOM_ERROR_OUT_OF_MEMORY = 3
LOOM_ERROR_INTERNAL = 4

MODE_SINGLE, MODE_FFN = 0, 1
DTYPE_FP8, DTYPE_BF16 = 0, 1
SCORING = {"softmax": 0, "sigmoid": 1}


class LoomError(RuntimeError):
    """A failure inside loom that is not the caller's argument (a CUDA error, a bug)."""


class Shape(ctypes.Structure):
    _fields_ = [
        ("tokens", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("inter", ctypes.c_int64),
        ("experts", ctypes.c_int64),
        ("topk", ctypes.c_int64),
        ("mode", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
    ]


class Routing(ctypes.Structure):
    _fields_ = [
        ("scoring", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("renormalize", ctypes.c_int32),
        ("n_group", ctypes.c_int32),
        ("topk_group", ctypes.c_int32),
        ("scale", ctypes.c_float),
    ]


class Options(ctypes.Structure):
    _fields_ = [
        ("deterministic", ctypes.c_int32),
        ("pdl", ctypes.c_int32),
        ("debug_checks", ctypes.c_int32),
        ("fuse_small_batch", ctypes.c_int32),
        ("expert_bins", ctypes.c_int32),
        ("gemm_config", ctypes.c_char_p),
        ("gemm2_config", ctypes.c_char_p),
    ]


class Weights(ctypes.Structure):
    _fields_ = [
        ("w1", ctypes.c_void_p),
        ("w1_scales", ctypes.c_void_p),
        ("w2", ctypes.c_void_p),
        ("w2_scales", ctypes.c_void_p),
    ]


class Inputs(ctypes.Structure):
    _fields_ = [
        ("tokens", ctypes.c_int64),
        ("hidden", ctypes.c_void_p),
        ("router_logits", ctypes.c_void_p),
        ("expert_bias", ctypes.c_void_p),
        ("topk_ids", ctypes.c_void_p),
        ("topk_weights", ctypes.c_void_p),
    ]


class LayerStatus(ctypes.Structure):
    _fields_ = [
        ("nan_tokens", ctypes.c_uint32),
        ("dropped_routes", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32 * 2),
    ]


def _candidates() -> list[Path]:
    """Where libloom.so may be: $LOOM_LIBRARY, beside this file (an installed wheel), then the
    build folders of a source checkout (python/loom -> the repository root)."""
    found = []
    if os.environ.get("LOOM_LIBRARY"):
        found.append(Path(os.environ["LOOM_LIBRARY"]))
    here = Path(__file__).resolve().parent
    found.append(here / "libloom.so")
    root = here.parent.parent
    for build in ("build", "build-python"):
        found.append(root / build / "src" / "libloom.so")
    return found


def _load() -> ctypes.CDLL:
    tried = []
    for path in _candidates():
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            break
        tried.append(str(path))
    else:
        raise ImportError("loom: libloom.so not found (set LOOM_LIBRARY or install the package); looked at "
                          + ", ".join(tried))
    lib.loom_abi_version.restype = ctypes.c_uint32
    lib.loom_abi_version.argtypes = []
    got = lib.loom_abi_version()
    if got != ABI_VERSION:
        raise ImportError(f"loom: library {path} has C ABI version {got}, this package expects {ABI_VERSION}")
    status = ctypes.c_int
    plan_p = ctypes.c_void_p
    sigs = {
        "loom_build_commit": (ctypes.c_char_p, []),
        "loom_last_error": (ctypes.c_char_p, []),
        "loom_routing_default": (None, [ctypes.POINTER(Routing)]),
        "loom_options_default": (None, [ctypes.POINTER(Options)]),
        "loom_plan_create": (status, [ctypes.POINTER(Shape), ctypes.POINTER(Routing), ctypes.POINTER(Options),
                                      ctypes.c_char_p, ctypes.POINTER(plan_p)]),
        "loom_plan_destroy": (None, [plan_p]),
        "loom_plan_workspace_bytes": (ctypes.c_size_t, [plan_p]),
        "loom_plan_shape": (status, [plan_p, ctypes.POINTER(Shape)]),
        "loom_plan_describe": (status, [plan_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
        "loom_run": (status, [plan_p, ctypes.POINTER(Weights), ctypes.POINTER(Inputs), ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_void_p]),
        "loom_read_status": (status, [plan_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(LayerStatus)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    lib.path = str(path)
    return lib


_lib = None


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first use, so that importing loom never fails for lack of it)."""
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def check(code: int) -> None:
    """Raises the exception a status code stands for, with loom's message."""
    if code == LOOM_OK:
        return
    message = lib().loom_last_error().decode(errors="replace")
    if code == LOOM_ERROR_INVALID_ARGUMENT:
        raise ValueError(f"loom: {message}")
    if code == LOOM_ERROR_OUT_OF_MEMORY:
        raise MemoryError(f"loom: {message}")
    raise LoomError(f"loom: {message}")


def abi_version() -> int:
    """The C ABI version of the loaded library (equal to ABI_VERSION, or the import would fail)."""
    return int(lib().loom_abi_version())


def build_commit() -> str:
    return lib().loom_build_commit().decode()


class Plan:
    """An owned loom plan (loom_plan_t): made once per shape, freed with the object."""

    def __init__(self, shape: Shape, routing: Routing, options: Options, device: str | None = None):
        handle = ctypes.c_void_p()
        check(lib().loom_plan_create(ctypes.byref(shape), ctypes.byref(routing), ctypes.byref(options),
                                     device.encode() if device else None, ctypes.byref(handle)))
        self._handle = handle
        self.workspace_bytes = int(lib().loom_plan_workspace_bytes(handle))
        planned = Shape()
        check(lib().loom_plan_shape(handle, ctypes.byref(planned)))
        self.max_tokens = int(planned.tokens)

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle and _lib is not None:
            _lib.loom_plan_destroy(handle)
            self._handle = None

    def describe(self) -> str:
        length = ctypes.c_size_t()
        check(lib().loom_plan_describe(self._handle, None, 0, ctypes.byref(length)))
        buf = ctypes.create_string_buffer(length.value + 1)
        check(lib().loom_plan_describe(self._handle, buf, len(buf), None))
        return buf.value.decode()

    def run(self, weights: Weights, inputs: Inputs, output: int, workspace: int, stream: int) -> None:
        # Per call: keep this to the one foreign call (argtypes convert the ints and the structs).
        code = _lib.loom_run(self._handle, weights, inputs, output, workspace, stream)
        if code:
            check(code)

    def read_status(self, workspace: int, stream: int) -> LayerStatus:
        st = LayerStatus()
        check(lib().loom_read_status(self._handle, ctypes.c_void_p(workspace), ctypes.c_void_p(stream),
                                     ctypes.byref(st)))
        return st


def default_routing() -> Routing:
    r = Routing()
    lib().loom_routing_default(ctypes.byref(r))
    return r


def default_options() -> Options:
    o = Options()
    lib().loom_options_default(ctypes.byref(o))
    return o
