"""CUDA-graph replay timing for the Python tools, as `loom bench` times (tools/bench/timer.cpp):
batches of 32 replays queued behind a spin kernel, so the GPU never waits for the host inside a
timed replay (the launch latency is not measured); the median of CUDA-event times, in µs."""

import statistics

import torch


def graph_median_us(fn, reps: int, warmup: int = 20) -> float:
    """Captures fn (run once eagerly first, so that nothing is planned or allocated in the capture)
    in a graph and times `reps` replays after `warmup` untimed ones."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(warmup):
        g.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for b in range(0, reps, 32):
        torch.cuda._sleep(2_000_000)
        for r in range(b, min(reps, b + 32)):
            starts[r].record()
            g.replay()
            ends[r].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
