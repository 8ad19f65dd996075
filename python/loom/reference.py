"""The MoE layer in plain PyTorch with loom's rounding points (docs/numerics.md), for tests and
comparisons: routing, the FP8 layer (ffn) and the one-GEMM layer (single). float64 arithmetic,
so it is slow and meant for small shapes."""

from __future__ import annotations

import torch

from .quant import dequantize, quantize_activations_fp8


def _rank(key: torch.Tensor, k: int) -> torch.Tensor:
    """The k best columns of key [T, n] under loom's rule: larger first, NaN last, ties to the lower index."""
    nan = torch.isnan(key)
    filled = torch.where(nan, torch.full_like(key, float("-inf")), key)
    order = torch.sort(filled, dim=1, descending=True, stable=True).indices
    # NaN after every number, -inf included: a second stable sort on the NaN flag.
    order = order.gather(1, torch.sort(nan.gather(1, order).to(torch.int8), dim=1, stable=True).indices)
    return order[:, :k]


def route(router_logits: torch.Tensor, topk: int, *, renormalize: bool = True, scoring: str = "softmax",
          softcap: float = 0.0, n_group: int = 1, topk_group: int = 1, routed_scaling: float = 1.0,
          expert_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (topk_ids int32 [T, k], topk_weights fp32 [T, k]) as loom routes."""
    logits = router_logits.double()
    T, E = logits.shape
    if scoring == "softmax":
        ids = _rank(logits, topk)
        capped = softcap * torch.tanh(logits / softcap) if softcap > 0 else logits
        probs = torch.softmax(torch.where(torch.isnan(capped), torch.full_like(capped, float("-inf")), capped), dim=1)
        weights = probs.gather(1, ids)
    elif scoring == "sigmoid":
        scores = torch.sigmoid(logits)
        key = scores + (expert_bias.double() if expert_bias is not None else 0.0)
        size = E // n_group
        groups = key.view(T, n_group, size)
        best2 = _rank(groups.reshape(T * n_group, size), min(2, size)).view(T, n_group, -1)
        gscore = groups.gather(2, best2).sum(dim=2)
        kept = _rank(gscore, topk_group)
        mask = torch.zeros(T, n_group, dtype=torch.bool, device=logits.device)
        mask.scatter_(1, kept, True)
        masked = torch.where(mask.repeat_interleave(size, dim=1), key, torch.full_like(key, float("nan")))
        ids = _rank(masked, topk)
        weights = torch.nan_to_num(scores.gather(1, ids), nan=0.0)
    else:
        raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    if renormalize:
        total = weights.sum(dim=1, keepdim=True)
        weights = torch.where(total > 0, weights / total, weights)
    return ids.to(torch.int32), (weights * routed_scaling).float()


def _combine(T: int, cols: int, topk_ids: torch.Tensor, topk_weights: torch.Tensor, expert_rows, device,
             bf16_rows: bool = False):
    """sum over each token's routes of weight * its expert's row, in double; bf16_rows: each weighted
    route row rounded to bf16 first (as the BF16 layer's GEMM 2 stores it)."""
    out = torch.zeros(T, cols, dtype=torch.float64, device=device)
    E = len(expert_rows)
    for e in range(E):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        y = expert_rows[e](tok) * topk_weights[tok, slot].double()[:, None]
        if bf16_rows:
            y = y.float().to(torch.bfloat16).double()
        out.index_add_(0, tok, y)
    return out


def fused_moe_reference(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, w13_scale, w2_scale,
                        topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """The ffn layer. FP8: hidden bf16 [T, H] quantised 1x128, w13 [E, 2I, H] and w2 [E, H, I] e4m3
    with 128x128 scales; SiLU(gate)*up rounded to fp32 and re-quantised 1x128. BF16 (bf16 w13 and
    w2, scales None): SiLU(gate)*up rounded to fp32 then bf16; each weighted route row rounded to
    bf16 before the sum. bf16 out [T, H]. Routes with ids outside [0, E) add nothing."""
    T, H = hidden.shape
    E, two_i, _ = w13.shape
    inter = two_i // 2
    if w13.dtype == torch.bfloat16:
        xb = hidden.double()

        def bf16_expert(e):
            w1, wd = w13[e].double(), w2[e].double()

            def rows(tok):
                h = xb[tok] @ w1.T
                gate, up = h[:, :inter], h[:, inter:]
                act = (gate / (1.0 + torch.exp(-gate)) * up).float().to(torch.bfloat16).double()
                return act @ wd.T
            return rows

        out = _combine(T, H, topk_ids, topk_weights, [bf16_expert(e) for e in range(E)], hidden.device, bf16_rows=True)
        return out.float().to(torch.bfloat16)
    xq, xs = quantize_activations_fp8(hidden)
    x = dequantize(xq, xs, 1).double()

    def expert(e):
        w1 = dequantize(w13[e], w13_scale[e], 128, segments=2).double()
        wd = dequantize(w2[e], w2_scale[e], 128).double()

        def rows(tok):
            h = x[tok] @ w1.T
            gate, up = h[:, :inter], h[:, inter:]
            act = (gate / (1.0 + torch.exp(-gate)) * up).float()
            aq, a_s = quantize_activations_fp8(act)
            return dequantize(aq, a_s, 1).double() @ wd.T
        return rows

    out = _combine(T, H, topk_ids, topk_weights, [expert(e) for e in range(E)], hidden.device)
    return out.float().to(torch.bfloat16)


def moe_single_reference(hidden: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, topk_ids: torch.Tensor,
                         topk_weights: torch.Tensor) -> torch.Tensor:
    """single mode: one FP8 GEMM per route (w [E, N, H]), the weighted sum over a token's routes, fp32 [T, N]."""
    T, H = hidden.shape
    E, N, _ = w.shape
    xq, xs = quantize_activations_fp8(hidden)
    x = dequantize(xq, xs, 1).double()

    def expert(e):
        we = dequantize(w[e], w_scale[e], 128).double()
        return lambda tok: x[tok] @ we.T

    return _combine(T, N, topk_ids, topk_weights, [expert(e) for e in range(E)], hidden.device).float()
