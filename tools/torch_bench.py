#!/usr/bin/env python3
"""The Python front's cost, measured against `loom bench` in the same run (issue 48):

- graph: loom.fused_moe captured in a torch.cuda.CUDAGraph, replayed; median of CUDA-event timed
  replays (warm L2), next to `loom bench`'s warm e2e median for the same shape (its JSON);
- host: median microseconds of host time of one eager call of loom.fused_moe, and of one call of
  the C ABI's loom_run through ctypes on the same plan (the C++ run() plus ctypes' own cost),
  interleaved, each starting on an idle GPU.

    python3 tools/torch_bench.py --loom build/tools/loom --tokens 1,128,2048 [--json out.json]
Needs a GPU, torch and the package (PYTHONPATH=python and LOOM_LIBRARY, or an installed loom)."""

import argparse
import json
import statistics
import subprocess
import tempfile
import time

import torch

import loom
from graph_timing import graph_median_us
from loom import _ops


def layer(T, H, I, E):
    g = torch.Generator(device="cuda").manual_seed(T)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    q13, s13 = loom.quantize_weights_fp8(r(E, 2 * I, H) * H ** -0.5, segments=2)
    q2, s2 = loom.quantize_weights_fp8(r(E, H, I) * I ** -0.5)
    return dict(hidden=r(T, H).to(torch.bfloat16), w13=q13, w2=q2, w13_scale=s13, w2_scale=s2, router_logits=r(T, E))


def call(a, k):
    return loom.fused_moe(a["hidden"], a["w13"], a["w2"], w13_scale=a["w13_scale"], w2_scale=a["w2_scale"],
                          router_logits=a["router_logits"], topk=k)


def host_samples(fns, reps=400):
    """Host microseconds of single calls of each fn, the calls interleaved; the GPU is idle at every
    call's start (a synchronisation before it, outside the timing), so no queue backlog counts."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, t in zip(fns, times):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            t.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return times


def direct_run(a, k):
    """loom_run on the op's own plan and workspace, through ctypes, bypassing the Python wrapper."""
    T, H = a["hidden"].shape
    E, two_i, _ = a["w13"].shape
    entry = _ops._entry(a["hidden"].device, loom._lib.MODE_FFN, loom._lib.DTYPE_FP8, T, H, two_i // 2, E, k,
                        _ops._routing_key("softmax", 0.0, True, 1, 1, 1.0), False)
    w = loom._lib.Weights(a["w13"].data_ptr(), a["w13_scale"].data_ptr(), a["w2"].data_ptr(), a["w2_scale"].data_ptr())
    out = torch.empty(T, H, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def run():
        inputs = loom._lib.Inputs(T, a["hidden"].data_ptr(), a["router_logits"].data_ptr(), 0, 0, 0)
        entry.plan.run(w, inputs, out.data_ptr(), entry.workspace.data_ptr(), stream)
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loom", default="build/tools/loom", help="the loom binary for the same-run comparison")
    p.add_argument("--tokens", default="1,128,2048")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=512)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--reps", type=int, default=500)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    H, I, E, k = args.hidden, args.inter, args.experts, args.topk
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([args.loom, "bench", "--mode", "ffn", "--hidden", str(H), "--inter", str(I), "--experts", str(E),
                        "--topk", str(k), "--tokens", args.tokens, "--reps", str(args.reps), "--no-sol", "--no-check",
                        "--json", f.name], check=True, stdout=subprocess.DEVNULL)
        bench = json.load(open(f.name))
    rows = []
    print(f"H={H} I={I} E={E} k={k}; us; graph = median replay, warm L2; host = one eager call; added = median of op - C ABI pairs")
    print(f"{'T':>6} {'torch graph':>12} {'loom bench':>11} {'ratio':>7} {'host op':>9} {'host C ABI':>11} {'added':>7}")
    for T in tokens:
        a = layer(T, H, I, E)
        g = graph_median_us(lambda: call(a, k), args.reps)
        rec = [r for r in bench if r["shape"]["tokens"] == T]
        warm = rec[0]["timings"]["e2e"]["warm"]["median_us"] if rec else float("nan")
        call(a, k)  # the plan and workspace exist before timing
        ops, directs = host_samples([lambda: call(a, k), direct_run(a, k)], reps=1000)
        op, direct = statistics.median(ops), statistics.median(directs)
        added = statistics.median(o - d for o, d in zip(ops, directs))  # per pair: robust to the host's drift
        rows.append(dict(tokens=T, graph_us=g, bench_warm_us=warm, host_op_us=op, host_c_abi_us=direct,
                         host_added_us=added))
        print(f"{T:>6} {g:>12.1f} {warm:>11.1f} {g / warm:>7.3f} {op:>9.1f} {direct:>11.1f} {added:>7.1f}")
    if args.json:
        json.dump(dict(commit=loom.build_commit(), shape=dict(hidden=H, inter=I, experts=E, topk=k), rows=rows),
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
