"""FP8 helpers in plain PyTorch, with loom's rounding points (docs/numerics.md): 128x128 block
scales for weights, 1x128 group scales for activations, and the w13 layout (gate rows, then up
rows, each its own run of 128-row blocks)."""

from __future__ import annotations

import torch

FP8_MAX = 448.0
BLOCK = 128


def _blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


def _quantize_blocks(x: torch.Tensor, row_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [E, R, C] -> codes e4m3 [E, R, C] and scales fp32 [E, ceil(R/row_block), ceil(C/128)]; a
    block is row_block x 128 (1 x 128 for activations), partial blocks at the ends are their own."""
    if x.dim() != 3:
        raise ValueError(f"expected a 3-d tensor [E, rows, cols], got shape {tuple(x.shape)}")
    E, R, C = x.shape
    xf = x.float()
    rb, cb = (R + row_block - 1) // row_block, _blocks(C)
    padded = torch.zeros(E, rb * row_block, cb * BLOCK, dtype=torch.float32, device=x.device)
    padded[:, :R, :C] = xf
    blocks = padded.view(E, rb, row_block, cb, BLOCK)
    # NaN elements are ignored by amax (docs/numerics.md); padding zeros never raise it.
    amax = torch.nan_to_num(blocks.abs(), nan=0.0).amax(dim=(2, 4))
    # Both divisions must be IEEE fp32 divisions (docs/numerics.md). On CUDA, torch divides by a
    # Python scalar as a multiplication by its rounded reciprocal, an ulp off at times, which moves
    # E4M3 ties: the scale is divided in float64 and rounded once (exact: 53 >= 2*24 + 2 bits), and
    # the codes divide tensor by tensor (test_gpu checks CUDA's codes against the CPU's).
    scale = (amax.clamp_min(1e-10).double() / FP8_MAX).float()
    q = (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    codes = q.view(E, rb * row_block, cb * BLOCK)[:, :R, :C].to(torch.float8_e4m3fn)
    return codes.contiguous(), scale.contiguous()


def quantize_weights_fp8(w: torch.Tensor, segments: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert weights [E, rows, cols] (bf16 or fp32) -> (e4m3 codes [E, rows, cols], fp32 scales).

    segments=2 for w13 [E, 2I, H]: gate rows and up rows are quantised apart, so no 128-row block
    mixes them; the scales are then [E, 2 ceil(I/128), ceil(H/128)] (gate blocks, then up blocks).
    A code times its block's scale is the dequantised weight."""
    if w.dim() != 3:
        raise ValueError(f"weights must be [E, rows, cols], got shape {tuple(w.shape)}")
    if w.shape[1] % segments:
        raise ValueError(f"{w.shape[1]} rows do not split into {segments} equal segments")
    parts = [_quantize_blocks(p, BLOCK) for p in w.chunk(segments, dim=1)]
    return torch.cat([c for c, _ in parts], dim=1), torch.cat([s for _, s in parts], dim=1)


def make_w13(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """[E, I, H] gate and up projections -> w13 [E, 2I, H] as loom (and vLLM) lay it out."""
    if gate.shape != up.shape or gate.dim() != 3:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must both be [E, I, H]")
    return torch.cat([gate, up], dim=1).contiguous()


def quantize_activations_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [T, C] -> (e4m3 codes [T, C], fp32 scales [T, ceil(C/128)]), one scale per 1x128 group."""
    codes, scales = _quantize_blocks(x.unsqueeze(0), 1)
    return codes[0], scales[0]


def dequantize(codes: torch.Tensor, scales: torch.Tensor, row_block: int, segments: int = 1) -> torch.Tensor:
    """The fp32 values of block-scaled codes [..., R, C] (row_block 128 for weights, 1 for activations)."""
    if segments > 1:
        cs = codes.chunk(segments, dim=-2)
        ss = scales.chunk(segments, dim=-2)
        return torch.cat([dequantize(c, s, row_block) for c, s in zip(cs, ss)], dim=-2)
    R, C = codes.shape[-2:]
    s = scales.repeat_interleave(row_block, dim=-2)[..., :R, :]
    s = s.repeat_interleave(BLOCK, dim=-1)[..., :C]
    return codes.float() * s
