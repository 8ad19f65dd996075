"""loom: fused Mixture-of-Experts layers for NVIDIA Hopper, from PyTorch.

    import loom
    out = loom.fused_moe(hidden, w13, w2, w13_scale=s13, w2_scale=s2, router_logits=logits, topk=8)

`fused_moe` is the whole layer (w13 -> SiLU(gate)*up -> w2 -> weighted combine, bf16 out);
`moe_single` the one-GEMM layer. Both are torch.library custom ops (loom::fused_moe,
loom::moe_single) with fake implementations, so they run under torch.compile and inside CUDA
graph capture. docs/api.md describes layouts, streams, devices, capture and errors."""

from __future__ import annotations

import weakref
from typing import Optional

import torch

from . import _lib, _ops
from ._lib import ABI_VERSION, LoomError
from .quant import dequantize, make_w13, quantize_activations_fp8, quantize_weights_fp8

__all__ = [
    "ABI_VERSION", "LoomError", "abi_version", "build_commit", "describe", "fused_moe", "layer_status",
    "make_w13", "moe_single", "prepare", "quantize_activations_fp8", "quantize_weights_fp8", "dequantize",
]

__version__ = "0.1.0"

_FP8 = torch.float8_e4m3fn
_FFN_WEIGHTS = ("w13", "w2", "w13_scale", "w2_scale")


def abi_version() -> int:
    """The loaded library's C ABI version (the import of the ops checks it equals ABI_VERSION)."""
    return _lib.abi_version()


def build_commit() -> str:
    """The commit the loaded library was built from."""
    return _lib.build_commit()


def _blocks(n: int) -> int:
    return (n + 127) // 128


def _fail(message: str, exc=ValueError):
    raise exc(f"loom: {message}")


def _check_tensor(name: str, t: torch.Tensor, dtype, shape: tuple, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dtype != dtype:
        _fail(f"{name} must be {dtype}, got {t.dtype}", TypeError)
    if t.device != device:
        _fail(f"{name} is on {t.device}, hidden on {device}: all tensors must be on one device")
    if t.shape != shape:  # (torch.Size compares with a tuple as one)
        _fail(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        _fail(f"{name} must be contiguous")


def _routing_args(hidden, experts, router_logits, topk_ids, topk_weights, expert_bias, topk, scoring, n_group,
                  topk_group):
    T = hidden.shape[0]
    dev = hidden.device
    if not (isinstance(topk, int) and 1 <= topk <= experts):
        _fail(f"topk must be an int in [1, {experts}], got {topk!r}")
    if scoring not in ("softmax", "sigmoid"):
        _fail(f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    if (router_logits is None) == (topk_ids is None):
        _fail("give router_logits, or topk_ids with topk_weights: exactly one of the two")
    if router_logits is not None:
        if topk_weights is not None:
            _fail("topk_weights goes with topk_ids, not with router_logits")
        if router_logits.dtype in (torch.bfloat16, torch.float16):
            router_logits = router_logits.float()  # loom routes from fp32 logits
        _check_tensor("router_logits", router_logits, torch.float32, (T, experts), dev)
    else:
        if topk_weights is None:
            _fail("topk_ids needs topk_weights")
        if topk_ids.dtype == torch.int64:
            topk_ids = topk_ids.to(torch.int32)
        _check_tensor("topk_ids", topk_ids, torch.int32, (T, topk), dev)
        _check_tensor("topk_weights", topk_weights, torch.float32, (T, topk), dev)
    if expert_bias is not None:
        if scoring != "sigmoid":
            _fail("expert_bias steers sigmoid scoring only")
        _check_tensor("expert_bias", expert_bias, torch.float32, (experts,), dev)
    if not (isinstance(n_group, int) and isinstance(topk_group, int)):
        _fail("n_group and topk_group must be ints")
    return router_logits, topk_ids, topk_weights


# Weights validated before, by the identity of their tensors: an eager call checks only that each
# is the same live object with the same storage pointer and version (in-place writes, resize_,
# as_strided_ and set_ bump the version), not every property again (~1.6 us of host time each).
_validated: dict = {}


def _weights_stamp(ts: tuple) -> tuple:
    return tuple((t.data_ptr(), t._version) if t is not None else None for t in ts)


def _known_weights(ts: tuple, device: torch.device, hidden_width: int):
    """(dims, pointers) of weights validated before and unchanged since, else None."""
    # One flat pass: this runs on every eager call.
    hit = _validated.get((*map(id, ts), hidden_width))
    if hit is None:
        return None
    refs, stamp, dev, known = hit
    for r, t, st in zip(refs, ts, stamp):
        if t is None:
            continue
        if r() is not t or t._version != st[1] or t.data_ptr() != st[0]:
            return None
    return known if dev == device else None


def _remember_weights(names: tuple, ts: tuple, device: torch.device, hidden_width: int, dims: tuple) -> tuple:
    ptrs = tuple(_ops.aligned_ptr(n, t) for n, t in zip(names, ts))
    if len(_validated) > 4096:  # weights that come and go (tests): forget them all now and then
        _validated.clear()
    refs = tuple(weakref.ref(t) if t is not None else None for t in ts)  # bf16 weights have no scales
    _validated[(*map(id, ts), hidden_width)] = (refs, _weights_stamp(ts), device, (dims, ptrs))
    return dims, ptrs


def _check_hidden(hidden: torch.Tensor) -> None:
    if not isinstance(hidden, torch.Tensor):
        _fail(f"hidden must be a torch.Tensor, got {type(hidden).__name__}", TypeError)
    if hidden.dim() != 2:
        _fail(f"hidden must be [T, H], got shape {tuple(hidden.shape)}")
    if hidden.dtype != torch.bfloat16:
        _fail(f"hidden must be torch.bfloat16, got {hidden.dtype}", TypeError)
    if hidden.device.type not in ("cuda", "meta"):
        _fail(f"hidden must be on a CUDA device, got {hidden.device}")
    if not hidden.is_contiguous():
        _fail("hidden must be contiguous")


def _check_ffn_weights(w13, w2, w13_scale, w2_scale, H: int, dev: torch.device) -> tuple:
    """(E, I, bf16) of valid ffn weights: e4m3 codes with their block scales, or bf16 values without."""
    if not (isinstance(w13, torch.Tensor) and w13.dim() == 3):
        _fail("w13 must be a [E, 2I, H] tensor", TypeError)
    E, two_i = w13.shape[0], w13.shape[1]
    if two_i % 2:
        _fail(f"w13 must have 2I rows (gate, then up), got {two_i}")
    inter = two_i // 2
    bf16 = w13.dtype == torch.bfloat16
    dtype = torch.bfloat16 if bf16 else _FP8
    if w13.dtype not in (torch.bfloat16, _FP8):
        _fail(f"w13 must be {_FP8} (with w13_scale) or torch.bfloat16, got {w13.dtype}", TypeError)
    if isinstance(w2, torch.Tensor) and w2.dtype != dtype:
        _fail(f"w13 and w2 must have one dtype ({_FP8} or torch.bfloat16), got {w13.dtype} and {w2.dtype}",
              TypeError)
    _check_tensor("w13", w13, dtype, (E, two_i, H), dev)
    _check_tensor("w2", w2, dtype, (E, H, inter), dev)
    if bf16:
        if w13_scale is not None or w2_scale is not None:
            _fail("bf16 weights take no w13_scale / w2_scale (those are the FP8 block scales)")
    else:
        if w13_scale is None or w2_scale is None:
            _fail("FP8 weights need w13_scale and w2_scale")
        _check_tensor("w13_scale", w13_scale, torch.float32, (E, 2 * _blocks(inter), _blocks(H)), dev)
        _check_tensor("w2_scale", w2_scale, torch.float32, (E, _blocks(H), _blocks(inter)), dev)
    return E, inter, bf16


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, *, router_logits: Optional[torch.Tensor] = None,
              topk_ids: Optional[torch.Tensor] = None, topk_weights: Optional[torch.Tensor] = None,
              w13_scale: Optional[torch.Tensor] = None, w2_scale: Optional[torch.Tensor] = None, topk: int,
              renormalize: bool = True, scoring: str = "softmax", softcap: float = 0.0, n_group: int = 1,
              topk_group: int = 1, routed_scaling: float = 1.0, expert_bias: Optional[torch.Tensor] = None,
              deterministic: bool = False, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The MoE layer: bf16 out [T, H] = sum over each token's k routes of weight * w2 @ (SiLU(gate) * up),
    (gate; up) = w13 @ hidden, in FP8 (hidden quantised per 1x128 group; weights e4m3 with 128x128
    block scales; the intermediate re-quantised per 1x128 group) or in BF16 (bf16 weights, no scales;
    the intermediate rounded to bf16; each weighted route row rounded to bf16 before the combine).

    hidden [T, H] bf16; w13 [E, 2I, H] e4m3 (gate rows, then up rows; vLLM's w13_weight), w13_scale
    [E, 2 ceil(I/128), ceil(H/128)] fp32; w2 [E, H, I] e4m3, w2_scale [E, ceil(H/128), ceil(I/128)]
    fp32; or w13 and w2 in bf16 with no scales. Routes: router_logits [T, E] (fp32; bf16/fp16 are
    widened), routed here by `scoring` with
    topk, renormalize, softcap, n_group/topk_group and expert_bias (sigmoid) and routed_scaling; or
    precomputed topk_ids [T, k] int32 (int64 narrowed) with topk_weights [T, k] fp32, used as given.
    deterministic: bitwise the same output run to run (no float atomics). out: a bf16 [T, H] tensor
    to write (returned). Routes whose id is outside [0, E) and NaN logits do not fail: they are
    counted in layer_status()."""
    _check_hidden(hidden)
    T, H = hidden.shape
    dev = hidden.device
    direct = _ops.eager(hidden)  # first: under torch.compile nothing below may touch ids or pointers
    weights = (w13, w2, w13_scale, w2_scale)
    known = _known_weights(weights, dev, H) if direct else None
    if known is None:
        dims = _check_ffn_weights(w13, w2, w13_scale, w2_scale, H, dev)
        known = _remember_weights(_FFN_WEIGHTS, weights, dev, H, dims) if direct else (dims, None)
    (E, inter, _), ptrs = known
    router_logits, topk_ids, topk_weights = _routing_args(hidden, E, router_logits, topk_ids, topk_weights,
                                                          expert_bias, topk, scoring, n_group, topk_group)
    args = (hidden, w13, w2, w13_scale, w2_scale, router_logits, topk_ids, topk_weights, expert_bias, topk,
            bool(renormalize), scoring, float(softcap), n_group, topk_group, float(routed_scaling),
            bool(deterministic))
    if out is None:
        return _ops.fused_moe_direct(*args, weight_ptrs=ptrs) if direct else torch.ops.loom.fused_moe(*args)
    _check_tensor("out", out, torch.bfloat16, (T, H), dev)
    if direct:
        _ops.ffn_into(out, *args, weight_ptrs=ptrs)
    else:
        torch.ops.loom.fused_moe_out(out, *args)
    return out


def moe_single(hidden: torch.Tensor, w: torch.Tensor, *, w_scale: torch.Tensor,
               router_logits: Optional[torch.Tensor] = None, topk_ids: Optional[torch.Tensor] = None,
               topk_weights: Optional[torch.Tensor] = None, topk: int, renormalize: bool = True,
               scoring: str = "softmax", softcap: float = 0.0, n_group: int = 1, topk_group: int = 1,
               routed_scaling: float = 1.0, expert_bias: Optional[torch.Tensor] = None,
               deterministic: bool = False) -> torch.Tensor:
    """loom's one-GEMM layer: fp32 out [T, N] = sum over each token's k routes of weight * w[e] @ hidden,
    w [E, N, H] e4m3 with w_scale [E, ceil(N/128), ceil(H/128)] fp32; routing as in fused_moe."""
    _check_hidden(hidden)
    T, H = hidden.shape
    dev = hidden.device
    direct = _ops.eager(hidden)
    known = _known_weights((w, w_scale), dev, H) if direct else None
    if known is None:
        if not (isinstance(w, torch.Tensor) and w.dim() == 3):
            _fail("w must be a [E, N, H] tensor", TypeError)
        dims = w.shape[0], w.shape[1]
        _check_tensor("w", w, _FP8, (*dims, H), dev)
        _check_tensor("w_scale", w_scale, torch.float32, (dims[0], _blocks(dims[1]), _blocks(H)), dev)
        known = _remember_weights(("w", "w_scale"), (w, w_scale), dev, H, dims) if direct else (dims, None)
    (E, N), ptrs = known
    router_logits, topk_ids, topk_weights = _routing_args(hidden, E, router_logits, topk_ids, topk_weights,
                                                          expert_bias, topk, scoring, n_group, topk_group)
    args = (hidden, w, w_scale, router_logits, topk_ids, topk_weights, expert_bias, topk, bool(renormalize), scoring,
            float(softcap), n_group, topk_group, float(routed_scaling), bool(deterministic))
    return _ops.moe_single_direct(*args, weight_ptrs=ptrs) if direct else torch.ops.loom.moe_single(*args)


def _dtype_code(dtype: str) -> int:
    if dtype not in ("fp8", "bf16"):
        _fail(f"dtype must be 'fp8' or 'bf16', got {dtype!r}")
    return _lib.DTYPE_FP8 if dtype == "fp8" else _lib.DTYPE_BF16


def prepare(device, *, max_tokens: int, hidden: int, inter: int, experts: int, topk: int, mode: str = "ffn",
            dtype: str = "fp8", renormalize: bool = True, scoring: str = "softmax", softcap: float = 0.0,
            n_group: int = 1, topk_group: int = 1, routed_scaling: float = 1.0, deterministic: bool = False) -> str:
    """Makes the plans and workspaces for every batch up to max_tokens before a CUDA graph capture
    (a first eager call does the same for its own T). dtype: the weights' ("fp8" or "bf16", ffn
    only). Returns the largest plan's description."""
    if mode not in ("ffn", "single"):
        _fail(f"mode must be 'ffn' or 'single', got {mode!r}")
    plan = _ops.prepare(torch.device(device), _lib.MODE_FFN if mode == "ffn" else _lib.MODE_SINGLE, _dtype_code(dtype),
                        max_tokens, hidden, inter, experts, topk,
                        _ops._routing_key(scoring, softcap, renormalize, n_group, topk_group, routed_scaling),
                        deterministic)
    return plan.describe()


def describe(*, tokens: int, hidden: int, inter: int, experts: int, topk: int, mode: str = "ffn",
             dtype: str = "fp8", deterministic: bool = False, device: Optional[str] = None) -> str:
    """What loom would launch for a shape: device None plans for the current GPU, "h200"/"h100" for
    a described one (no GPU needed)."""
    if mode not in ("ffn", "single"):
        _fail(f"mode must be 'ffn' or 'single', got {mode!r}")
    o = _lib.default_options()
    o.deterministic = int(deterministic)
    shape = _lib.Shape(tokens, hidden, inter, experts, topk, _lib.MODE_FFN if mode == "ffn" else _lib.MODE_SINGLE,
                       _dtype_code(dtype))
    return _lib.Plan(shape, _lib.default_routing(), o, device).describe()


def layer_status(device=None) -> dict:
    """The status word of the last run on `device` (synchronises its current stream): tokens with a
    NaN router logit, and routes whose expert id was out of range (ignored)."""
    st = _ops.layer_status(torch.device(device) if device is not None else torch.device("cuda",
                                                                                        torch.cuda.current_device()))
    return {"nan_tokens": int(st.nan_tokens), "dropped_routes": int(st.dropped_routes)}
