"""The ops on the GPU against the plain-PyTorch reference with loom's rounding points
(loom.reference), under eager, torch.compile and CUDA-graph capture, on a side stream, with
precomputed routes and from router logits. Tolerances as docs/numerics.md states them for the
layer against the reference's own intermediate: 1e-2 overall, 5e-2 on every token row (ffn);
2e-3 and 1e-2 for the one-GEMM layer."""

import pytest
import torch

import loom
from loom.reference import fused_moe_reference, moe_single_reference, route

from conftest import requires_gpu

pytestmark = requires_gpu
FFN_TOL, FFN_ROW_TOL = 1e-2, 5e-2


def rel_errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    g, w = got.double(), want.double()
    assert torch.isfinite(g).all(), "non-finite output"
    overall = ((g - w).norm() / w.norm()).item()
    rows = ((g - w).norm(dim=1) / w.norm(dim=1).clamp_min(1e-30)).max().item()
    return overall, rows


def make_layer(T, H, I, E, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")  # noqa: E731
    hidden = randn(T, H).to(torch.bfloat16)
    q13, s13 = loom.quantize_weights_fp8(randn(E, 2 * I, H) * H ** -0.5, segments=2)
    q2, s2 = loom.quantize_weights_fp8(randn(E, H, I) * I ** -0.5)
    return dict(hidden=hidden, w13=q13, w2=q2, w13_scale=s13, w2_scale=s2, router_logits=randn(T, E))


def run(layer, **kw):
    a = dict(layer)
    hidden, w13, w2 = a.pop("hidden"), a.pop("w13"), a.pop("w2")
    a.update(kw)
    return loom.fused_moe(hidden, w13, w2, **a)


def reference(layer, topk, **routing):
    ids, weights = route(layer["router_logits"], topk, **routing)
    return fused_moe_reference(layer["hidden"], layer["w13"], layer["w2"], layer["w13_scale"], layer["w2_scale"],
                               ids, weights), ids, weights


SHAPES = [  # T, H, I, E, k
    (1, 2048, 512, 256, 8),
    (3, 1024, 192, 16, 4),
    (17, 2048, 512, 64, 8),
    (128, 2048, 512, 256, 8),
    (300, 512, 320, 8, 2),
    (1000, 1024, 256, 32, 1),
]


@pytest.mark.parametrize("T,H,I,E,k", SHAPES)
@pytest.mark.parametrize("deterministic", [False, True])
def test_layer_from_logits_matches_the_reference(T, H, I, E, k, deterministic):
    layer = make_layer(T, H, I, E, seed=T + E)
    poison = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = run(layer, topk=k, deterministic=deterministic, out=poison)
    want, _, _ = reference(layer, k)
    overall, row = rel_errors(out, want)
    assert overall <= FFN_TOL and row <= FFN_ROW_TOL, (overall, row)


@pytest.mark.parametrize("dist", ["balanced", "zipf", "hot"])
def test_layer_from_topk_ids_matches_the_reference(dist):
    T, H, I, E, k = 256, 1024, 256, 64, 4
    layer = make_layer(T, H, I, E, seed=7)
    gen = torch.Generator().manual_seed(3)
    if dist == "balanced":
        ids = (torch.arange(T * k) % E).view(T, k)
    elif dist == "zipf":
        p = 1.0 / torch.arange(1, E + 1).double() ** 1.2
        ids = torch.stack([torch.multinomial(p, k, replacement=False, generator=gen) for _ in range(T)])
    else:  # 90 % of the routes on expert 0's neighbourhood, the rest spread; ids distinct per token
        ids = torch.stack([torch.randperm(E, generator=gen)[:k] if t % 10 == 9 else torch.arange(k) for t in range(T)])
    ids = ids.to(torch.int32).cuda()
    weights = torch.rand(T, k, generator=gen).cuda()
    out = run(layer, router_logits=None, topk_ids=ids, topk_weights=weights, topk=k)
    want = fused_moe_reference(layer["hidden"], layer["w13"], layer["w2"], layer["w13_scale"], layer["w2_scale"],
                               ids, weights)
    overall, row = rel_errors(out, want)
    assert overall <= FFN_TOL and row <= FFN_ROW_TOL, (overall, row)
    # int64 ids (as some engines keep them) give the same output.
    out64 = run(layer, router_logits=None, topk_ids=ids.long(), topk_weights=weights, topk=k, deterministic=True)
    out32 = run(layer, router_logits=None, topk_ids=ids, topk_weights=weights, topk=k, deterministic=True)
    assert torch.equal(out64, out32)


def test_sigmoid_grouped_routing_with_bias_and_softcap_softmax():
    T, H, I, E, k = 64, 512, 128, 32, 4
    layer = make_layer(T, H, I, E, seed=11)
    bias = torch.randn(E, device="cuda") * 0.1
    out = run(layer, topk=k, scoring="sigmoid", n_group=4, topk_group=2, expert_bias=bias, routed_scaling=2.5)
    want, _, _ = reference(layer, k, scoring="sigmoid", n_group=4, topk_group=2, expert_bias=bias, routed_scaling=2.5)
    overall, row = rel_errors(out, want)
    assert overall <= FFN_TOL and row <= FFN_ROW_TOL, (overall, row)
    out = run(layer, topk=k, softcap=3.0, renormalize=False)
    want, _, _ = reference(layer, k, softcap=3.0, renormalize=False)
    overall, row = rel_errors(out, want)
    assert overall <= FFN_TOL and row <= FFN_ROW_TOL, (overall, row)


def make_bf16_layer(T, H, I, E, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")  # noqa: E731
    return dict(hidden=randn(T, H).to(torch.bfloat16), w13=(randn(E, 2 * I, H) * H ** -0.5).to(torch.bfloat16),
                w2=(randn(E, H, I) * I ** -0.5).to(torch.bfloat16), w13_scale=None, w2_scale=None,
                router_logits=randn(T, E))


BF16_SHAPES = [  # T, H, I, E, k
    (1, 1024, 1536, 8, 1),
    (33, 1024, 512, 16, 4),
    (300, 2048, 1024, 16, 8),
]


@pytest.mark.parametrize("T,H,I,E,k", BF16_SHAPES)
def test_bf16_layer_matches_the_reference_eager_and_in_a_graph(T, H, I, E, k):
    # No requantisation: the tolerance is the GEMM's own (docs/numerics.md), 2e-3 and 1e-2 per row.
    layer = make_bf16_layer(T, H, I, E, seed=T + 1)
    want, ids, weights = reference(layer, k)
    outs = {}
    for deterministic in (False, True):
        out = run(layer, topk=k, deterministic=deterministic)
        overall, row = rel_errors(out, want)
        assert overall <= 2e-3 and row <= 1e-2, (deterministic, overall, row)
        outs[deterministic] = out
        # The reference's routes (its weights may differ from loom's routing in the last bit).
        by_ids = run(layer, router_logits=None, topk_ids=ids, topk_weights=weights, topk=k,
                     deterministic=deterministic)
        overall, row = rel_errors(by_ids, want)
        assert overall <= 2e-3 and row <= 1e-2, (deterministic, overall, row)
    graph = torch.cuda.CUDAGraph()
    static_out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    with torch.cuda.graph(graph):
        run(layer, topk=k, out=static_out, deterministic=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, outs[True])


def test_bf16_logits_are_widened():
    layer = make_layer(33, 512, 128, 16, seed=5)
    layer16 = dict(layer, router_logits=layer["router_logits"].to(torch.bfloat16))
    a = run(layer16, topk=2, deterministic=True)
    b = run(dict(layer, router_logits=layer16["router_logits"].float()), topk=2, deterministic=True)
    assert torch.equal(a, b)


def test_quantisation_on_the_gpu_equals_the_cpu_bit_for_bit():
    # The reference's codes must not depend on the device it runs on (torch's CUDA division by a
    # scalar is not IEEE; loom.quant avoids it).
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(512, 1024, generator=gen, device="cuda").to(torch.bfloat16)
    bits = lambda t: t.cpu().view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t.cpu()  # noqa: E731
    for got, want in zip(loom.quantize_activations_fp8(x), loom.quantize_activations_fp8(x.cpu())):
        assert torch.equal(bits(got), bits(want))
    w = torch.randn(4, 384, 640, generator=gen, device="cuda")
    for got, want in zip(loom.quantize_weights_fp8(w, segments=2), loom.quantize_weights_fp8(w.cpu(), segments=2)):
        assert torch.equal(bits(got), bits(want))


def test_single_mode_matches_the_reference():
    T, H, N, E, k = 40, 1024, 512, 32, 4
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(T, H, generator=gen).to(torch.bfloat16).cuda()
    w, ws = loom.quantize_weights_fp8(torch.randn(E, N, H, generator=gen) * H ** -0.5)
    w, ws = w.cuda(), ws.cuda()
    logits = torch.randn(T, E, generator=gen).cuda()
    out = loom.moe_single(hidden, w, w_scale=ws, router_logits=logits, topk=k)
    ids, weights = route(logits, k)
    overall, row = rel_errors(out, moe_single_reference(hidden, w, ws, ids, weights))
    assert overall <= 2e-3 and row <= 1e-2, (overall, row)


def test_deterministic_is_bitwise_stable_eager_compiled_and_in_a_graph():
    T, H, I, E, k = 200, 1024, 256, 64, 8
    layer = make_layer(T, H, I, E, seed=1)
    first = run(layer, topk=k, deterministic=True)
    for _ in range(3):
        assert torch.equal(run(layer, topk=k, deterministic=True), first)
    compiled = torch.compile(lambda **a: run(a, topk=k, deterministic=True), fullgraph=True, dynamic=True)
    assert torch.equal(compiled(**layer), first)
    static = {name: t.clone() for name, t in layer.items()}
    run(static, topk=k, deterministic=True)  # the plan and workspace exist before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(static, topk=k, deterministic=True)
    fresh = make_layer(T, H, I, E, seed=99)
    for name in ("hidden", "router_logits"):
        static[name].copy_(fresh[name])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, run(dict(layer, hidden=fresh["hidden"], router_logits=fresh["router_logits"]),
                                     topk=k, deterministic=True))


def test_fast_mode_under_compile_graph_and_a_side_stream():
    T, H, I, E, k = 128, 2048, 512, 256, 8
    layer = make_layer(T, H, I, E, seed=4)
    want, _, _ = reference(layer, k)
    compiled = torch.compile(lambda **a: run(a, topk=k), fullgraph=True, dynamic=True)
    for T2 in (T, 37):  # a second T in the same plan bucket: no recompilation needed
        part = {n: t[:T2].clone() if n in ("hidden", "router_logits") else t for n, t in layer.items()}
        got = compiled(**part)
        overall, row = rel_errors(got, want[:T2])
        assert overall <= FFN_TOL and row <= FFN_ROW_TOL, (T2, overall, row)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = run(layer, topk=k)
    torch.cuda.current_stream().wait_stream(side)
    overall, row = rel_errors(got, want)
    assert overall <= FFN_TOL and row <= FFN_ROW_TOL, (overall, row)
    static = {name: t.clone() for name, t in layer.items()}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(static, topk=k)
    for _ in range(3):
        captured.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    overall, row = rel_errors(captured, want)
    assert overall <= FFN_TOL and row <= FFN_ROW_TOL, (overall, row)


def test_a_new_shape_inside_a_capture_is_refused_with_the_remedy():
    layer = make_layer(20, 512, 128, 8, seed=8)
    with pytest.raises(RuntimeError, match="before CUDA graph capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            run(layer, topk=3, routed_scaling=1.75)  # a routing no earlier call planned
    loom.prepare("cuda", max_tokens=64, hidden=512, inter=128, experts=8, topk=3, routed_scaling=1.75)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(layer, topk=3, routed_scaling=1.75)
    graph.replay()
    want, _, _ = reference(layer, 3, routed_scaling=1.75)
    overall, row = rel_errors(out, want)
    assert overall <= FFN_TOL and row <= FFN_ROW_TOL


def test_opcheck_on_the_gpu():
    layer = make_layer(24, 512, 128, 8, seed=12)
    args = (layer["hidden"], layer["w13"], layer["w2"], layer["w13_scale"], layer["w2_scale"], layer["router_logits"],
            None, None, None, 2, True, "softmax", 0.0, 1, 1, 1.0, True)
    # opcheck's schema test compares the inputs elementwise, which torch cannot do for float8 on CUDA
    # (test_cpu runs it on meta tensors); here the inputs' bytes are compared instead.
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    before = [a.view(torch.uint8).clone() if a.dtype == torch.float8_e4m3fn else a.clone()
              for a in args if isinstance(a, torch.Tensor)]
    results = torch.library.opcheck(torch.ops.loom.fused_moe.default, args, test_utils=utils)
    assert all(v == "SUCCESS" for v in results.values()), results
    after = [a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a for a in args if isinstance(a, torch.Tensor)]
    assert all(torch.equal(x, y) for x, y in zip(before, after)), "the op wrote to an input"


def test_weights_changed_after_a_call_are_checked_again():
    # Eager calls remember validated weights by identity, pointer and version; any change is seen.
    layer = make_layer(8, 512, 128, 8, seed=13)
    run(layer, topk=2)
    layer["w13_scale"].resize_(8, 1, 1)  # same storage, new shape: the version moves
    with pytest.raises(ValueError, match="w13_scale must have shape"):
        run(layer, topk=2)
    layer = make_layer(8, 512, 128, 8, seed=13)
    run(layer, topk=2)
    layer["w2"].data = torch.zeros(8, 512, 128, dtype=torch.bfloat16, device="cuda")  # new storage
    with pytest.raises(TypeError, match="one dtype"):
        run(layer, topk=2)


def test_edge_cases_zero_tokens_bad_ids_misaligned_views_and_mixed_weights():
    layer = make_layer(16, 512, 128, 8, seed=6)
    empty = run(dict(layer, hidden=layer["hidden"][:0], router_logits=layer["router_logits"][:0]), topk=2)
    assert empty.shape == (0, 512)
    ids = torch.randint(0, 8, (16, 2), dtype=torch.int32, device="cuda")
    ids[3, 1] = 8  # out of range: dropped and counted
    ids[5, 0] = -1
    weights = torch.rand(16, 2, device="cuda")
    out = run(layer, router_logits=None, topk_ids=ids, topk_weights=weights, topk=2)
    st = loom.layer_status()
    assert st["dropped_routes"] == 2, st
    keep = (ids >= 0) & (ids < 8)
    want = fused_moe_reference(layer["hidden"], layer["w13"], layer["w2"], layer["w13_scale"], layer["w2_scale"],
                               torch.where(keep, ids, torch.full_like(ids, 99)), torch.where(keep, weights, 0))
    overall, row = rel_errors(out, want)
    assert overall <= FFN_TOL and row <= FFN_ROW_TOL, (overall, row)
    nan_logits = layer["router_logits"].clone()
    nan_logits[2, 0] = float("nan")
    run(layer, router_logits=nan_logits, topk=2)
    assert loom.layer_status()["nan_tokens"] == 1
    buf = torch.empty(16 * 512 + 8, dtype=torch.bfloat16, device="cuda")
    shifted = buf[8:].view(16, 512)  # contiguous, but 16 bytes past the block start + 0: 16-aligned
    shifted.copy_(layer["hidden"])
    run(dict(layer, hidden=shifted), topk=2)
    odd = buf[4:4 + 16 * 512].view(16, 512)  # 8 bytes off
    with pytest.raises(ValueError, match="16-byte boundary"):
        run(dict(layer, hidden=odd), topk=2)
    with pytest.raises(TypeError, match="one dtype"):
        run(dict(layer, w13=torch.zeros(8, 256, 512, dtype=torch.bfloat16, device="cuda")), topk=2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="GPU test skipped: needs two GPUs")
def test_tensors_on_the_second_gpu_run_there_whatever_the_current_device():
    torch.cuda.set_device(0)
    layer = {n: t.to("cuda:1") for n, t in make_layer(40, 512, 128, 16, seed=21).items()}
    out = run(layer, topk=4, deterministic=True)
    assert out.device == torch.device("cuda:1")
    want, _, _ = reference(layer, 4)
    overall, row = rel_errors(out, want)
    assert overall <= FFN_TOL and row <= FFN_ROW_TOL, (overall, row)
    assert torch.cuda.current_device() == 0
