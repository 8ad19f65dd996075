#!/usr/bin/env python3
"""A small MoE block in PyTorch (a router and SwiGLU experts in bf16), run with plain PyTorch and
with loom (its experts quantised to FP8 with 128x128 block scales), printing how far apart the two
outputs are and how long each takes.

    PYTHONPATH=python LOOM_LIBRARY=build/src/libloom.so python3 examples/torch_moe_layer.py
(or, after `pip install .`, just python3 examples/torch_moe_layer.py). Needs an H100/H200."""

import torch

import loom


class MoEBlock(torch.nn.Module):
    def __init__(self, hidden=2048, inter=512, experts=64, topk=8):
        super().__init__()
        self.topk = topk
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        scale = hidden ** -0.5
        self.gate = torch.nn.Parameter(torch.randn(experts, inter, hidden) * scale)
        self.up = torch.nn.Parameter(torch.randn(experts, inter, hidden) * scale)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, inter) * inter ** -0.5)

    def forward(self, x):  # plain PyTorch: softmax top-k, renormalised, a loop over experts
        logits = self.router(x).float()
        weights, ids = torch.softmax(logits, dim=-1).topk(self.topk, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x, dtype=torch.float32)
        for e in range(self.gate.shape[0]):
            tok, slot = torch.nonzero(ids == e, as_tuple=True)
            if tok.numel():
                h = x[tok]
                act = torch.nn.functional.silu(h @ self.gate[e].T) * (h @ self.up[e].T)
                out.index_add_(0, tok, (act @ self.down[e].T).float() * weights[tok, slot, None])
        return out.to(x.dtype)


class LoomMoE(torch.nn.Module):
    """The same block on loom: w13 = (gate; up), both projections in FP8."""

    def __init__(self, block: MoEBlock):
        super().__init__()
        self.router, self.topk = block.router, block.topk
        with torch.no_grad():
            self.w13, self.w13_scale = loom.quantize_weights_fp8(loom.make_w13(block.gate, block.up), segments=2)
            self.w2, self.w2_scale = loom.quantize_weights_fp8(block.down)

    def forward(self, x):
        return loom.fused_moe(x, self.w13, self.w2, w13_scale=self.w13_scale, w2_scale=self.w2_scale,
                              router_logits=self.router(x).float(), topk=self.topk)


def time_us(fn, reps=50):
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def main():
    torch.manual_seed(0)
    block = MoEBlock().cuda().to(torch.bfloat16)
    fast = LoomMoE(block)
    for tokens in (1, 128, 2048):
        x = torch.randn(tokens, 2048, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            want, got = block(x), fast(x)
            diff = ((got.float() - want.float()).norm() / want.float().norm()).item()
            t_torch, t_loom = time_us(lambda: block(x)), time_us(lambda: fast(x))
        print(f"T={tokens:>5}: relative difference {diff:.2e} (FP8 against bf16); "
              f"PyTorch {t_torch:8.1f} us, loom {t_loom:7.1f} us (eager, router included)")


if __name__ == "__main__":
    main()
