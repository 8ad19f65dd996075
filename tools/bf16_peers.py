#!/usr/bin/env python3
"""Same-run peers for the BF16 MoE layer (issue 47): the layer's two GEMMs on the same
expert-sorted rows with what anyone can install, timed as `loom bench` times (CUDA graph replays
queued behind a spin kernel, median), and loom's own rows from its JSON where given.

- torch._grouped_mm: w13 then w2 over the expert-sorted rows (one call per GEMM);
- cuBLAS per expert: one torch.mm per expert and GEMM (captured in the same graph).

Both time the GEMMs alone (SiLU*up computed once beforehand), and the layer's FLOPs are counted on
compact routed rows: 6 T k H I.

    python3 tools/bf16_peers.py --tokens 512,2048,8192,32768 [--loom-json bench.json] [--json out.json]
Needs a GPU (sm_90) and torch; the preset h200-bf16's shape by default."""

import argparse
import json

import torch

from graph_timing import graph_median_us


def routes(T, E, k, gen):
    """Random distinct experts per token (the `random` distribution): rows per expert, sorted."""
    scores = torch.rand(T, E, generator=gen, device="cuda")
    ids = scores.topk(k, dim=1).indices
    counts = torch.bincount(ids.flatten(), minlength=E)
    return counts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="512,2048,8192,32768")
    p.add_argument("--hidden", type=int, default=3072)
    p.add_argument("--inter", type=int, default=1536)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--loom-json", help="`loom bench --json` output of the same shape: its GPU rows join the table")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    H, I, E, k = args.hidden, args.inter, args.experts, args.topk
    gen = torch.Generator(device="cuda").manual_seed(1)
    w13 = (torch.randn(E, 2 * I, H, generator=gen, device="cuda") * H ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=gen, device="cuda") * I ** -0.5).to(torch.bfloat16)
    loom_rows = {}
    if args.loom_json:
        for r in json.load(open(args.loom_json)):
            e2e = r.get("timings", {}).get("e2e")
            gemm = r.get("timings", {}).get("gemm")
            if e2e and r["shape"]["dtype"] == "bf16":
                loom_rows[r["shape"]["tokens"]] = (e2e["cold"]["median_us"], gemm["cold"]["median_us"] if gemm else None)
    rows = []
    print(f"H={H} I={I} E={E} k={k}; the two GEMMs alone, us (TFLOP/s on 6 T k H I)")
    print(f"{'T':>6} {'_grouped_mm':>18} {'cuBLAS per expert':>20} {'loom GEMMs':>18} {'loom e2e':>18}")
    for T in [int(t) for t in args.tokens.split(",")]:
        counts = routes(T, E, k, gen)
        R = int(counts.sum())
        offs = torch.cumsum(counts, 0).to(torch.int32)
        bounds = [0] + offs.tolist()
        x = torch.randn(R, H, generator=gen, device="cuda").to(torch.bfloat16)
        act = torch.randn(R, I, generator=gen, device="cuda").to(torch.bfloat16)
        h = torch.empty(R, 2 * I, dtype=torch.bfloat16, device="cuda")
        y = torch.empty(R, H, dtype=torch.bfloat16, device="cuda")
        w13_t, w2_t = w13.transpose(1, 2), w2.transpose(1, 2)  # [E, H, 2I], [E, I, H]: the K-major B operands

        def grouped():
            torch._grouped_mm(x, w13_t, offs=offs, out_dtype=torch.bfloat16)
            torch._grouped_mm(act, w2_t, offs=offs, out_dtype=torch.bfloat16)

        def per_expert():
            for e in range(E):
                lo, hi = bounds[e], bounds[e + 1]
                if hi > lo:
                    torch.mm(x[lo:hi], w13[e].t(), out=h[lo:hi])
                    torch.mm(act[lo:hi], w2[e].t(), out=y[lo:hi])

        flops = 6.0 * R * H * I
        tf = lambda us: flops / (us * 1e6)  # noqa: E731
        row = dict(tokens=T, routed_rows=R, flops=flops)
        try:
            row["grouped_mm_us"] = graph_median_us(grouped, args.reps, warmup=5)
        except (RuntimeError, AttributeError) as e:  # an older torch, or a shape it refuses
            row["grouped_mm_error"] = str(e).splitlines()[0]
        row["cublas_per_expert_us"] = graph_median_us(per_expert, args.reps, warmup=5)
        if T in loom_rows:
            row["loom_e2e_us"], row["loom_gemm_us"] = loom_rows[T]
        rows.append(row)
        cell = lambda key: f"{row[key]:.1f} ({tf(row[key]):.0f})" if row.get(key) else "-"  # noqa: E731
        print(f"{T:>6} {cell('grouped_mm_us'):>18} {cell('cublas_per_expert_us'):>20} {cell('loom_gemm_us'):>18} "
              f"{cell('loom_e2e_us'):>18}")
    if args.json:
        json.dump(dict(shape=dict(hidden=H, inter=I, experts=E, topk=k), rows=rows), open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
