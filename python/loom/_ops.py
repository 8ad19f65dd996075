"""The torch.library ops over the C ABI (loom::fused_moe, loom::fused_moe_out, loom::moe_single),
their fake (meta) implementations, and the cache of plans and workspaces (per device and shape
bucket, made before any CUDA graph capture).

Eager calls outside any tracing go straight to the implementation (`direct`): the dispatcher's
own cost per call would be several times what loom's launches cost on the host. Under
torch.compile, a TorchDispatchMode, fake or meta tensors, the calls go through the registered ops."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

import torch

from . import _lib

# Plans are made for a bucket of token counts: the next power of two at or above T (at least 16).
# A plan runs any T up to its bucket; its workspace is sized for the bucket.
MIN_BUCKET = 16


def bucket(tokens: int) -> int:
    return max(MIN_BUCKET, 1 << (tokens - 1).bit_length()) if tokens > 1 else MIN_BUCKET


@dataclass
class _Entry:
    plan: _lib.Plan
    workspace: torch.Tensor
    workspace_ptr: int
    stream: Optional[int] = None  # the stream of the last eager run
    weights: dict = field(default_factory=dict)  # weight pointers -> their loom_weights_t


_cache: dict = {}
_last: dict = {}  # device index -> the entry of the last run there (for layer_status)
_lock = threading.Lock()


def _entry(device: torch.device, mode: int, dtype: int, tokens: int, hidden: int, inter: int, experts: int,
           topk: int, routing: tuple, deterministic: bool) -> _Entry:
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, mode, dtype, bucket(tokens), hidden, inter, experts, topk, routing, deterministic)
    entry = _cache.get(key)
    if entry is not None:
        return entry
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"loom: no plan for this shape (T bucket {bucket(tokens)}, H={hidden}, I={inter}, E={experts}, k={topk}) "
            "was made before CUDA graph capture, and loom does not allocate inside a capture: run the layer once "
            "eagerly with this shape (or call loom.prepare) before capturing")
    scoring, softcap, renormalize, n_group, topk_group, scale = routing
    shape = _lib.Shape(bucket(tokens), hidden, inter, experts, topk, mode, dtype)
    r = _lib.default_routing()
    r.scoring = _lib.SCORING[scoring]
    r.softcap, r.renormalize, r.n_group, r.topk_group, r.scale = softcap, int(renormalize), n_group, topk_group, scale
    o = _lib.default_options()
    o.deterministic = int(deterministic)
    device = torch.device("cuda", index)
    with _lock, torch.cuda.device(device):
        entry = _cache.get(key)
        if entry is None:
            plan = _lib.Plan(shape, r, o)
            # Through PyTorch's caching allocator, zeroed once; 256-byte aligned (the allocator's
            # blocks are 512-byte aligned).
            workspace = torch.zeros(max(plan.workspace_bytes, 256), dtype=torch.uint8, device=device)
            entry = _cache[key] = _Entry(plan, workspace, workspace.data_ptr())
    return entry


def aligned_ptr(name: str, t: Optional[torch.Tensor]) -> int:
    if t is None:
        return 0
    p = t.data_ptr()
    if p & 15:
        raise ValueError(f"loom: {name} must start on a 16-byte boundary (a view at an offset of its storage is "
                         "not; pass a fresh or .clone()d tensor)")
    return p


# The current stream's raw handle without making a Stream object (a private but long-standing
# binding; the public call where it is missing).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# The current device without torch.cuda.current_device()'s lazy-init check (a CUDA tensor exists,
# so CUDA is initialised).
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def _stream_handle(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(torch.device("cuda", index)).cuda_stream


def _run(entry: _Entry, device: torch.device, weights: tuple, inputs: _lib.Inputs, output: int) -> None:
    w = entry.weights.get(weights)
    if w is None:
        w = entry.weights[weights] = _lib.Weights(*weights)
    current = _current_device()
    index = device.index if device.index is not None else current
    handle = _stream_handle(index)
    # One workspace per plan: an eager run on another stream than the last waits for that stream's
    # work so far (which includes the last run), so two streams never share it at once. Inside a
    # capture the caller orders the replays, as for any buffer a graph holds.
    if handle != entry.stream and not torch.cuda.is_current_stream_capturing():
        if entry.stream is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.ExternalStream(entry.stream, device=index))
            torch.cuda.ExternalStream(handle, device=index).wait_event(event)
        entry.stream = handle
    if index == current:
        entry.plan.run(w, inputs, output, entry.workspace_ptr, handle)
    else:  # loom launches on the current device: make it the tensors'
        with torch.cuda.device(index):
            entry.plan.run(w, inputs, output, entry.workspace_ptr, handle)
    _last[index] = entry


def _routing_key(scoring, softcap, renormalize, n_group, topk_group, routed_scaling) -> tuple:
    return (scoring, float(softcap), bool(renormalize), int(n_group), int(topk_group), float(routed_scaling))


def _inputs(hidden, router_logits, topk_ids, topk_weights, expert_bias) -> _lib.Inputs:
    # Straight-line, one alignment test for all five: this runs on every eager call.
    p0 = hidden.data_ptr()
    p1 = router_logits.data_ptr() if router_logits is not None else 0
    p2 = expert_bias.data_ptr() if expert_bias is not None else 0
    p3 = topk_ids.data_ptr() if topk_ids is not None else 0
    p4 = topk_weights.data_ptr() if topk_weights is not None else 0
    if (p0 | p1 | p2 | p3 | p4) & 15:
        for name, t in zip(("hidden", "router_logits", "expert_bias", "topk_ids", "topk_weights"),
                           (hidden, router_logits, expert_bias, topk_ids, topk_weights)):
            aligned_ptr(name, t)
    return _lib.Inputs(hidden.shape[0], p0, p1, p2, p3, p4)


def ffn_into(out, hidden, w13, w2, w13_scale, w2_scale, router_logits, topk_ids, topk_weights, expert_bias, topk,
             renormalize, scoring, softcap, n_group, topk_group, routed_scaling, deterministic,
             weight_ptrs=None) -> None:
    T, H = hidden.shape
    if T == 0:
        return
    E, two_i, _ = w13.shape
    device = hidden.device
    dtype = _lib.DTYPE_BF16 if w13.dtype == torch.bfloat16 else _lib.DTYPE_FP8
    entry = _entry(device, _lib.MODE_FFN, dtype, T, H, two_i // 2, E, topk,
                   _routing_key(scoring, softcap, renormalize, n_group, topk_group, routed_scaling), deterministic)
    if weight_ptrs is None:  # (the eager path passes the pointers of the weights it validated)
        weight_ptrs = (aligned_ptr("w13", w13), aligned_ptr("w2", w2), aligned_ptr("w13_scale", w13_scale),
                       aligned_ptr("w2_scale", w2_scale))
    weights = (weight_ptrs[0], weight_ptrs[2], weight_ptrs[1], weight_ptrs[3])  # loom_weights_t's order
    _run(entry, device, weights, _inputs(hidden, router_logits, topk_ids, topk_weights, expert_bias),
         aligned_ptr("out", out))


def fused_moe_direct(hidden, w13, w2, w13_scale, w2_scale, router_logits, topk_ids, topk_weights, expert_bias, topk,
                     renormalize, scoring, softcap, n_group, topk_group, routed_scaling, deterministic,
                     weight_ptrs=None):
    out = torch.empty_like(hidden)  # bf16 [T, H], contiguous as hidden is (the cheapest allocation call)
    ffn_into(out, hidden, w13, w2, w13_scale, w2_scale, router_logits, topk_ids, topk_weights, expert_bias, topk,
             renormalize, scoring, softcap, n_group, topk_group, routed_scaling, deterministic, weight_ptrs)
    return out


def moe_single_direct(hidden, w, w_scale, router_logits, topk_ids, topk_weights, expert_bias, topk, renormalize,
                      scoring, softcap, n_group, topk_group, routed_scaling, deterministic, weight_ptrs=None):
    T, H = hidden.shape
    E, N, _ = w.shape
    out = hidden.new_empty((T, N), dtype=torch.float32)
    if T == 0:
        return out
    device = hidden.device
    entry = _entry(device, _lib.MODE_SINGLE, _lib.DTYPE_FP8, T, H, N, E, topk,
                   _routing_key(scoring, softcap, renormalize, n_group, topk_group, routed_scaling), deterministic)
    if weight_ptrs is None:
        weight_ptrs = (aligned_ptr("w", w), aligned_ptr("w_scale", w_scale))
    weights = (weight_ptrs[0], weight_ptrs[1], 0, 0)
    _run(entry, device, weights, _inputs(hidden, router_logits, topk_ids, topk_weights, expert_bias),
         aligned_ptr("out", out))
    return out


def eager(hidden: torch.Tensor) -> bool:
    """Whether a call may skip the dispatcher: plain CUDA tensors, nothing tracing or intercepting."""
    # is_compiling first: under dynamo the rest is not evaluated (nor traced).
    return (not torch.compiler.is_compiling() and type(hidden) is torch.Tensor and hidden.is_cuda
            and torch._C._len_torch_dispatch_stack() == 0)


_ROUTING = ("Tensor? router_logits, Tensor? topk_ids, Tensor? topk_weights, Tensor? expert_bias, int topk, "
            "bool renormalize, str scoring, float softcap, int n_group, int topk_group, float routed_scaling, "
            "bool deterministic")
_def = torch.library.Library("loom", "DEF")
_def.define(f"fused_moe(Tensor hidden, Tensor w13, Tensor w2, Tensor? w13_scale, Tensor? w2_scale, {_ROUTING}) -> Tensor")
_def.define(f"fused_moe_out(Tensor(a!) out, Tensor hidden, Tensor w13, Tensor w2, Tensor? w13_scale, Tensor? w2_scale, "
            f"{_ROUTING}) -> ()")
_def.define(f"moe_single(Tensor hidden, Tensor w, Tensor w_scale, {_ROUTING}) -> Tensor")
_def.impl("fused_moe", fused_moe_direct, "CUDA")
_def.impl("fused_moe_out", ffn_into, "CUDA")
_def.impl("moe_single", moe_single_direct, "CUDA")


@torch.library.register_fake("loom::fused_moe", lib=_def)
def _(hidden, w13, w2, w13_scale, w2_scale, router_logits, topk_ids, topk_weights, expert_bias, topk, renormalize,
      scoring, softcap, n_group, topk_group, routed_scaling, deterministic):
    return hidden.new_empty((hidden.shape[0], hidden.shape[1]), dtype=torch.bfloat16)


@torch.library.register_fake("loom::fused_moe_out", lib=_def)
def _(out, hidden, w13, w2, w13_scale, w2_scale, router_logits, topk_ids, topk_weights, expert_bias, topk,
      renormalize, scoring, softcap, n_group, topk_group, routed_scaling, deterministic):
    return None


@torch.library.register_fake("loom::moe_single", lib=_def)
def _(hidden, w, w_scale, router_logits, topk_ids, topk_weights, expert_bias, topk, renormalize, scoring, softcap,
      n_group, topk_group, routed_scaling, deterministic):
    return hidden.new_empty((hidden.shape[0], w.shape[1]), dtype=torch.float32)


def prepare(device: torch.device, mode: int, dtype: int, max_tokens: int, hidden: int, inter: int, experts: int,
            topk: int, routing: tuple, deterministic: bool) -> _lib.Plan:
    """Makes (or finds) the plan and workspace for every bucket up to max_tokens."""
    t = MIN_BUCKET
    while True:
        entry = _entry(device, mode, dtype, min(t, max(max_tokens, 1)), hidden, inter, experts, topk, routing,
                       deterministic)
        if t >= max_tokens:
            return entry.plan
        t *= 2


def layer_status(device: torch.device) -> _lib.LayerStatus:
    index = device.index if device.index is not None else torch.cuda.current_device()
    entry = _last.get(index)
    if entry is None:
        raise RuntimeError(f"loom: no run on cuda:{index} yet")
    return entry.plan.read_status(entry.workspace_ptr, torch.cuda.current_stream(torch.device("cuda", index)).cuda_stream)
