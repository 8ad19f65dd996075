"""Expert parallelism from PyTorch: the MoE layer across the ranks of a torch.distributed process
group, one GPU each, each owning some of the E experts (loom/dist.hpp, through libloom_dist.so).

    import torch.distributed as dist, loom.dist
    dist.init_process_group("nccl")                       # or any backend: it carries only the NCCL id
    ep = loom.dist.ExpertParallel(experts=256, topk=8, hidden=7168, inter=2048, max_tokens=4096)
    w13, w2 = weights_of(ep.local_experts)                # this rank's experts, in that order
    out = ep(hidden, w13, w2, w13_scale=s13, w2_scale=s2, router_logits=logits)

Every rank of the group calls the layer for every run, with its own tokens (T may differ, 0
included). loom makes its own NCCL communicator over the group's ranks: the group's first rank
makes a unique id and broadcasts it through the group, so any backend works (PyTorch does not hand
out its communicator in a form another NCCL build may use). NVLink multicast is off in it
(NCCL_NVLS_ENABLE=0) unless the environment says otherwise. docs/api.md has the contract."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional, Sequence

import torch

from . import _lib

__all__ = ["ExpertParallel", "available"]


class _Ep(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("first_expert", ctypes.c_int64),
        ("expert_count", ctypes.c_int64),
        ("expert_rank", ctypes.POINTER(ctypes.c_int32)),
        ("expert_rank_count", ctypes.c_int64),
        ("rows_per_peer", ctypes.c_int64),
        ("chunks", ctypes.c_int32),
        ("comm_sms", ctypes.c_int32),
        ("tokens_per_peer", ctypes.c_int64),
    ]


class _EpStatus(ctypes.Structure):
    _fields_ = [
        ("nan_tokens", ctypes.c_uint32),
        ("dropped_routes", ctypes.c_uint32),
        ("overflow_routes", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]


_dlib = None


def _load() -> ctypes.CDLL:
    main = _lib.lib()  # libloom.so first: libloom_dist.so needs it (found beside it through $ORIGIN)
    path = Path(os.environ.get("LOOM_DIST_LIBRARY") or Path(main.path).with_name("libloom_dist.so"))
    if not path.is_file():
        raise ImportError(f"loom: expert parallelism needs libloom_dist.so (a build with NCCL); not at {path} "
                          "(set LOOM_DIST_LIBRARY)")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:  # NCCL's library missing, say
        raise ImportError(f"loom: cannot load libloom_dist.so ({path}): {e}") from e
    lib.loom_ep_abi_version.restype = ctypes.c_uint32
    if lib.loom_ep_abi_version() != _lib.ABI_VERSION:
        raise ImportError(f"loom: {path} has C ABI version {lib.loom_ep_abi_version()}, this package expects "
                          f"{_lib.ABI_VERSION}")
    status, plan_p, vp = ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p
    sigs = {
        "loom_ep_last_error": (ctypes.c_char_p, []),
        "loom_ep_default": (None, [ctypes.POINTER(_Ep)]),
        "loom_nccl_unique_id": (status, [ctypes.c_char_p]),
        "loom_nccl_comm_create": (status, [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(vp)]),
        "loom_nccl_comm_destroy": (status, [vp]),
        "loom_ep_plan_create": (status, [ctypes.POINTER(_lib.Shape), ctypes.POINTER(_lib.Routing),
                                         ctypes.POINTER(_lib.Options), ctypes.POINTER(_Ep), ctypes.POINTER(plan_p)]),
        "loom_ep_plan_destroy": (None, [plan_p]),
        "loom_ep_plan_workspace_bytes": (ctypes.c_size_t, [plan_p]),
        "loom_ep_plan_local_experts": (status, [plan_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int64,
                                                ctypes.POINTER(ctypes.c_int64)]),
        "loom_ep_plan_describe": (status, [plan_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
        "loom_ep_run": (status, [plan_p, ctypes.POINTER(_lib.Weights), ctypes.POINTER(_lib.Inputs), vp, vp, vp, vp]),
        "loom_ep_read_status": (status, [plan_p, vp, vp, ctypes.POINTER(_EpStatus)]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


def _dist_lib() -> ctypes.CDLL:
    global _dlib
    if _dlib is None:
        _dlib = _load()
    return _dlib


def available() -> Optional[str]:
    """None when expert parallelism can run here (libloom_dist.so loads), else why not."""
    try:
        _dist_lib()
    except ImportError as e:
        return str(e)
    return None


def _check(code: int) -> None:
    if code == _lib.LOOM_OK:
        return
    message = _dist_lib().loom_ep_last_error().decode(errors="replace")
    if code == _lib.LOOM_ERROR_INVALID_ARGUMENT:
        raise ValueError(f"loom: {message}")
    if code == _lib.LOOM_ERROR_OUT_OF_MEMORY:
        raise MemoryError(f"loom: {message}")
    raise _lib.LoomError(f"loom: {message}")


class ExpertParallel:
    """The ffn MoE layer over the ranks of `group` (None: the default group), this rank owning
    `local_experts`. experts, topk, hidden, inter: the layer's (all E experts); max_tokens: the most
    tokens one rank's run carries. expert_rank: every expert's owner (E group ranks), or None for
    contiguous blocks. tokens_per_peer, rows_per_peer: the caps of token rows one rank sends to one
    peer and of route outputs one peer returns per run (0: twice a balanced share); routes beyond
    them are not sent and counted in status(). chunks: the exchange and the local experts in that
    many parts, overlapped; comm_sms: the SMs the local GEMMs leave to NCCL then (-1: the default).
    deterministic: each route's output comes back and the rows are summed in slot order, so the
    output equals the one-GPU layer's with deterministic=True bit for bit (BF16; FP8 where the
    local batch takes the same GEMM configs); else each owner sums its routes of a token and
    returns one row (fewer bytes; within the layer's tolerance). Routing options as in
    loom.fused_moe."""

    def __init__(self, group=None, *, experts: int, topk: int, hidden: int, inter: int, max_tokens: int,
                 dtype: str = "fp8", expert_rank: Optional[Sequence[int]] = None, rows_per_peer: int = 0,
                 tokens_per_peer: int = 0, chunks: int = 1, comm_sms: int = -1, deterministic: bool = False,
                 renormalize: bool = True,
                 scoring: str = "softmax", softcap: float = 0.0, n_group: int = 1, topk_group: int = 1,
                 routed_scaling: float = 1.0, device=None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("loom: ExpertParallel needs an initialised torch.distributed process group")
        if dtype not in ("fp8", "bf16"):
            raise ValueError(f"loom: dtype must be 'fp8' or 'bf16', got {dtype!r}")
        if scoring not in _lib.SCORING:
            raise ValueError(f"loom: scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
        lib = _dist_lib()
        self._comm = None
        self._plan = None
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if self.device.type != "cuda":
            raise ValueError(f"loom: the device must be a CUDA device, got {self.device}")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.experts, self.topk, self.hidden, self.inter, self.max_tokens = experts, topk, hidden, inter, max_tokens
        self.bf16 = dtype == "bf16"
        self._routing = dict(renormalize=renormalize, scoring=scoring, softcap=softcap, n_group=n_group,
                             topk_group=topk_group, routed_scaling=routed_scaling)

        # The plan first (its checks need no peer), then the communicator.
        shape = _lib.Shape(max_tokens, hidden, inter, experts, topk, _lib.MODE_FFN,
                           _lib.DTYPE_BF16 if self.bf16 else _lib.DTYPE_FP8)
        r = _lib.default_routing()
        r.scoring = _lib.SCORING[scoring]
        r.softcap, r.renormalize, r.n_group, r.topk_group, r.scale = (softcap, int(renormalize), n_group, topk_group,
                                                                      routed_scaling)
        o = _lib.default_options()
        o.deterministic = int(deterministic)
        ep = _Ep()
        lib.loom_ep_default(ctypes.byref(ep))
        ep.size, ep.rank, ep.rows_per_peer = self.size, self.rank, rows_per_peer
        ep.tokens_per_peer = tokens_per_peer
        ep.chunks, ep.comm_sms = chunks, comm_sms
        if expert_rank is not None:
            owners = (ctypes.c_int32 * len(expert_rank))(*[int(q) for q in expert_rank])
            ep.expert_rank, ep.expert_rank_count = owners, len(expert_rank)
        plan = ctypes.c_void_p()
        with torch.cuda.device(self.device):
            _check(lib.loom_ep_plan_create(ctypes.byref(shape), ctypes.byref(r), ctypes.byref(o), ctypes.byref(ep),
                                           ctypes.byref(plan)))
        self._plan = plan
        count = ctypes.c_int64()
        _check(lib.loom_ep_plan_local_experts(plan, None, 0, ctypes.byref(count)))
        mine = (ctypes.c_int32 * count.value)()
        _check(lib.loom_ep_plan_local_experts(plan, mine, count.value, None))
        self.local_experts = list(mine)
        self._workspace = torch.zeros(max(int(lib.loom_ep_plan_workspace_bytes(plan)), 256), dtype=torch.uint8,
                                      device=self.device)

        # The NCCL id from the group's first rank to every rank, through the group's own backend.
        nccl_id = ctypes.create_string_buffer(128)
        if self.rank == 0:
            _check(lib.loom_nccl_unique_id(nccl_id))
        box = [nccl_id.raw]
        source = dist.get_global_rank(group, 0) if group is not None else 0
        backend = dist.get_backend(group)
        dist.broadcast_object_list(box, src=source, group=group,
                                   device=self.device if backend == "nccl" else torch.device("cpu"))
        comm = ctypes.c_void_p()
        with torch.cuda.device(self.device):
            _check(lib.loom_nccl_comm_create(box[0], self.size, self.rank, ctypes.byref(comm)))
        self._comm = comm

    def describe(self) -> str:
        lib = _dist_lib()
        length = ctypes.c_size_t()
        _check(lib.loom_ep_plan_describe(self._plan, None, 0, ctypes.byref(length)))
        buf = ctypes.create_string_buffer(length.value + 1)
        _check(lib.loom_ep_plan_describe(self._plan, buf, len(buf), None))
        return buf.value.decode()

    def __call__(self, hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, *,
                 w13_scale: Optional[torch.Tensor] = None, w2_scale: Optional[torch.Tensor] = None,
                 router_logits: Optional[torch.Tensor] = None, topk_ids: Optional[torch.Tensor] = None,
                 topk_weights: Optional[torch.Tensor] = None, expert_bias: Optional[torch.Tensor] = None,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """bf16 out [T, H] of this rank's tokens. w13 [E_local, 2I, H] and w2 [E_local, H, I] hold
        this rank's experts in local_experts' order (with their block scales for FP8); routes as in
        loom.fused_moe, with global expert ids."""
        from . import _check_ffn_weights, _check_hidden, _check_tensor, _routing_args
        from ._ops import _inputs, aligned_ptr

        if self._plan is None or self._comm is None:
            raise RuntimeError("loom: this ExpertParallel is closed")
        _check_hidden(hidden)
        T, H = hidden.shape
        if hidden.device != self.device:
            raise ValueError(f"loom: hidden is on {hidden.device}, the layer on {self.device}")
        if H != self.hidden or T > self.max_tokens:
            raise ValueError(f"loom: hidden must be [T <= {self.max_tokens}, {self.hidden}], got {tuple(hidden.shape)}")
        e_local, inter, bf16 = _check_ffn_weights(w13, w2, w13_scale, w2_scale, H, self.device)
        if (e_local, inter, bf16) != (len(self.local_experts), self.inter, self.bf16):
            raise ValueError(f"loom: this rank's weights must hold its {len(self.local_experts)} experts of I = "
                             f"{self.inter} in {'bf16' if self.bf16 else 'fp8'}, got {e_local} of I = {inter} in "
                             f"{'bf16' if bf16 else 'fp8'}")
        rt = self._routing
        router_logits, topk_ids, topk_weights = _routing_args(hidden, self.experts, router_logits, topk_ids,
                                                              topk_weights, expert_bias, self.topk, rt["scoring"],
                                                              rt["n_group"], rt["topk_group"])
        if out is None:
            out = torch.empty((T, H), dtype=torch.bfloat16, device=self.device)
        else:
            _check_tensor("out", out, torch.bfloat16, (T, H), self.device)
        weights = _lib.Weights(aligned_ptr("w13", w13), aligned_ptr("w13_scale", w13_scale), aligned_ptr("w2", w2),
                               aligned_ptr("w2_scale", w2_scale))
        inputs = _inputs(hidden, router_logits, topk_ids, topk_weights, expert_bias)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        with torch.cuda.device(self.device):
            _check(_dist_lib().loom_ep_run(self._plan, ctypes.byref(weights), ctypes.byref(inputs),
                                           aligned_ptr("out", out), self._workspace.data_ptr(),
                                           self._comm, stream))
        return out

    def status(self) -> dict:
        """The last run's status on this rank (synchronises the current stream): tokens with a NaN
        logit, routes with an id out of range, routes beyond the caps (not sent)."""
        st = _EpStatus()
        stream = torch.cuda.current_stream(self.device).cuda_stream
        with torch.cuda.device(self.device):
            _check(_dist_lib().loom_ep_read_status(self._plan, self._workspace.data_ptr(), stream, ctypes.byref(st)))
        return {"nan_tokens": int(st.nan_tokens), "dropped_routes": int(st.dropped_routes),
                "overflow_routes": int(st.overflow_routes)}

    def close(self) -> None:
        """Frees the plan and the communicator, every rank together (NCCL's destroy may wait for the
        peers). Drop every CUDA graph that captured this layer first: NCCL's destroy waits until no
        graph holds its calls."""
        lib = _dlib
        if lib is None:
            return
        if getattr(self, "_comm", None) is not None:
            comm, self._comm = self._comm, None
            with torch.cuda.device(self.device):
                _check(lib.loom_nccl_comm_destroy(comm))
        if getattr(self, "_plan", None) is not None:
            plan, self._plan = self._plan, None
            lib.loom_ep_plan_destroy(plan)

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter exit CUDA may be gone: nothing left to free then
            pass
