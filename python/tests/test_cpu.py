"""The package without a GPU: the library and its ABI version, plans for a described device,
argument validation, the fake (meta) implementations under torch.compile, the FP8 helpers and the
reference's routing rules."""

import pytest
import torch

import loom
from loom import _lib
from loom.quant import dequantize
from loom.reference import route

FP8 = torch.float8_e4m3fn


def test_library_abi_version_matches_the_package():
    assert loom.abi_version() == loom.ABI_VERSION == _lib.ABI_VERSION
    assert len(loom.build_commit()) >= 7


def test_describe_plans_for_a_described_device():
    text = loom.describe(tokens=128, hidden=2048, inter=512, experts=256, topk=8, device="h200")
    assert "T=128 H=2048 I=512 E=256 k=8 fp8 ffn" in text
    assert "launches by token count" in text
    det = loom.describe(tokens=8192, hidden=2048, inter=512, experts=256, topk=8, device="h200", deterministic=True)
    assert "combine+bf16" in det
    with pytest.raises(ValueError, match="multiple of 16"):
        loom.describe(tokens=1, hidden=100, inter=512, experts=8, topk=2, device="h200")
    with pytest.raises(ValueError, match="a100"):
        loom.describe(tokens=1, hidden=2048, inter=512, experts=8, topk=2, device="a100")


def meta_layer(T=5, H=256, I=128, E=8, k=2):
    m = torch.device("meta")
    b = lambda n: (n + 127) // 128  # noqa: E731
    return dict(
        hidden=torch.empty(T, H, dtype=torch.bfloat16, device=m),
        w13=torch.empty(E, 2 * I, H, dtype=FP8, device=m),
        w2=torch.empty(E, H, I, dtype=FP8, device=m),
        w13_scale=torch.empty(E, 2 * b(I), b(H), device=m),
        w2_scale=torch.empty(E, b(H), b(I), device=m),
        router_logits=torch.empty(T, E, device=m),
    )


def call(args, **over):
    a = dict(args)
    a.update(over)
    hidden, w13, w2 = a.pop("hidden"), a.pop("w13"), a.pop("w2")
    a.setdefault("topk", 2)
    return loom.fused_moe(hidden, w13, w2, **a)


def test_meta_tensors_give_the_output_shape():
    out = call(meta_layer())
    assert out.shape == (5, 256) and out.dtype == torch.bfloat16 and out.device.type == "meta"
    a = meta_layer()
    ids = torch.empty(5, 2, dtype=torch.int64, device="meta")
    out = call(a, router_logits=None, topk_ids=ids, topk_weights=torch.empty(5, 2, device="meta"))
    assert out.shape == (5, 256)
    m = torch.device("meta")
    bf = dict(a, w13=torch.empty(8, 256, 256, dtype=torch.bfloat16, device="meta"),
              w2=torch.empty(8, 256, 128, dtype=torch.bfloat16, device="meta"), w13_scale=None, w2_scale=None)
    assert call(bf).shape == (5, 256)  # bf16 weights, no scales
    single = loom.moe_single(torch.empty(3, 256, dtype=torch.bfloat16, device=m),
                             torch.empty(8, 512, 256, dtype=FP8, device=m), w_scale=torch.empty(8, 4, 2, device=m),
                             router_logits=torch.empty(3, 8, device=m), topk=2)
    assert single.shape == (3, 512) and single.dtype == torch.float32


@pytest.mark.parametrize("change, exc, match", [
    (dict(hidden=torch.empty(5, 256, dtype=torch.float16, device="meta")), TypeError, "hidden must be torch.bfloat16"),
    (dict(hidden=torch.empty(5, 256, 2, dtype=torch.bfloat16, device="meta")), ValueError, r"hidden must be \[T, H\]"),
    (dict(hidden=torch.empty(256, 5, dtype=torch.bfloat16, device="meta").t()), ValueError, "hidden must be contiguous"),
    (dict(hidden=torch.empty(5, 256, dtype=torch.bfloat16)), ValueError, "CUDA device"),
    (dict(w13=torch.empty(8, 256, 256, dtype=torch.bfloat16, device="meta")), TypeError, "one dtype"),
    (dict(w13=torch.empty(8, 256, 256, dtype=torch.bfloat16, device="meta"),
          w2=torch.empty(8, 256, 128, dtype=torch.bfloat16, device="meta")), ValueError, "take no w13_scale"),
    (dict(w13=torch.empty(8, 256, 256, dtype=torch.int8, device="meta")), TypeError, "w13 must be torch.float8"),
    (dict(w2=torch.empty(8, 256, 64, dtype=FP8, device="meta")), ValueError, r"w2 must have shape \(8, 256, 128\)"),
    (dict(w13_scale=None), ValueError, "need w13_scale"),
    (dict(w13_scale=torch.empty(8, 1, 2, device="meta")), ValueError, r"w13_scale must have shape \(8, 2, 2\)"),
    (dict(w2_scale=torch.empty(8, 2, 1, dtype=torch.float64, device="meta")), TypeError, "w2_scale must be torch.float32"),
    (dict(router_logits=torch.empty(4, 8, device="meta")), ValueError, r"router_logits must have shape \(5, 8\)"),
    (dict(router_logits=None), ValueError, "exactly one"),
    (dict(topk_ids=torch.empty(5, 2, dtype=torch.int32, device="meta")), ValueError, "exactly one"),
    (dict(router_logits=None, topk_ids=torch.empty(5, 2, dtype=torch.int32, device="meta")), ValueError,
     "needs topk_weights"),
    (dict(router_logits=None, topk_ids=torch.empty(5, 3, dtype=torch.int32, device="meta"),
          topk_weights=torch.empty(5, 3, device="meta")), ValueError, r"topk_ids must have shape \(5, 2\)"),
    (dict(router_logits=None, topk_ids=torch.empty(5, 2, dtype=torch.float32, device="meta"),
          topk_weights=torch.empty(5, 2, device="meta")), TypeError, "topk_ids must be torch.int32"),
    (dict(topk=0), ValueError, "topk must be"),
    (dict(topk=9), ValueError, "topk must be"),
    (dict(scoring="relu"), ValueError, "scoring must be"),
    (dict(expert_bias=torch.empty(8, device="meta")), ValueError, "sigmoid scoring only"),
    (dict(out=torch.empty(5, 256, dtype=torch.float32, device="meta")), TypeError, "out must be torch.bfloat16"),
    (dict(out=torch.empty(4, 256, dtype=torch.bfloat16, device="meta")), ValueError, r"out must have shape"),
])
def test_bad_arguments_are_refused_with_the_reason(change, exc, match):
    with pytest.raises(exc, match=match):
        call(meta_layer(), **change)


def test_compiled_op_has_no_graph_break_and_no_recompilation_per_T():
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    torch._dynamo.reset()

    def layer(hidden, w13, w2, w13_scale, w2_scale, router_logits):
        return loom.fused_moe(hidden, w13, w2, w13_scale=w13_scale, w2_scale=w2_scale, router_logits=router_logits,
                              topk=2) * 2

    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=True)
    for T in (5, 7, 33, 100):
        out = compiled(**meta_layer(T=T))
        assert out.shape == (T, 256)
    assert counter.frame_count == 1, f"{counter.frame_count} compilations for four token counts"


def test_quantised_weights_follow_the_block_rules():
    torch.manual_seed(0)
    E, I, H = 3, 80, 200  # partial blocks on both axes; gate and up of 80 rows each
    w = torch.randn(E, 2 * I, H, dtype=torch.bfloat16)
    codes, scales = loom.quantize_weights_fp8(w, segments=2)
    assert codes.dtype == FP8 and codes.shape == w.shape
    assert scales.shape == (E, 2, 2)  # one gate block, one up block; 128 + 72 columns
    # The largest element of each block maps to +-448 exactly; every value within half an E4M3 step.
    for e in range(E):
        for seg in range(2):
            block = w[e, seg * I:(seg + 1) * I, 128:].float()
            s = scales[e, seg, 1]
            assert torch.isclose(s, block.abs().max() / 448.0, rtol=0, atol=0)
            q = codes[e, seg * I:(seg + 1) * I, 128:].float()
            assert q.abs().max() == 448.0
    back = dequantize(codes, scales, 128, segments=2)
    rel = (back - w.float()).norm() / w.float().norm()
    assert rel < 0.05, rel
    x = torch.randn(7, 200, dtype=torch.bfloat16)
    xc, xs = loom.quantize_activations_fp8(x)
    assert xs.shape == (7, 2)
    assert torch.equal(xs[:, 0], x[:, :128].float().abs().amax(dim=1) / 448.0)
    assert (dequantize(xc, xs, 1) - x.float()).norm() / x.float().norm() < 0.05
    assert torch.equal(loom.make_w13(w[:, :I], w[:, I:]), w)


def test_quantisation_divides_as_ieee_and_ties_go_to_even():
    # amax 2.625: the scale is exactly 3/512, so 0.26953125 / scale is exactly 46, the midpoint of the
    # E4M3 values 44 and 48, and goes to the even code (48). A scale an ulp high (a multiplication by
    # the rounded 1/448) would give 45.999996 and code 44.
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    x[0, 0], x[0, 1], x[0, 2] = 2.625, 0.26953125, -1.453125  # -1.453125 / scale = -248: ties to -256
    codes, scales = loom.quantize_activations_fp8(x)
    assert scales.item() == 3 / 512
    assert codes[0, :3].float().tolist() == [448.0, 48.0, -256.0]


def test_reference_routing_ranks_as_loom_does():
    logits = torch.tensor([[1.0, 3.0, 3.0, float("nan"), -float("inf"), 2.0]])
    ids, weights = route(logits, 4, renormalize=False)
    assert ids.tolist() == [[1, 2, 5, 0]]  # ties to the lower index; NaN after -inf is not reached
    ids, _ = route(logits, 6, renormalize=False)
    assert ids.tolist() == [[1, 2, 5, 0, 4, 3]]  # -inf before NaN
    p = torch.softmax(torch.tensor([1.0, 3.0, 3.0, 2.0], dtype=torch.float64), 0)
    assert torch.allclose(weights[0].double(), p[[1, 2, 3, 0]].double(), rtol=1e-6)
    ids, weights = route(logits, 2, renormalize=True, routed_scaling=2.5)
    assert torch.allclose(weights.sum(), torch.tensor(2.5))
    # Sigmoid with groups: the best two groups by their two best biased scores, then the top k.
    g = torch.tensor([[0.0, 0.1, 5.0, -5.0, 1.0, 1.0, -1.0, -1.0]])
    ids, weights = route(g, 2, scoring="sigmoid", n_group=4, topk_group=2, renormalize=False)
    # Group scores {0,1}: 0.5 + 0.525, {2,3}: 0.993 + 0.007, {4,5}: 0.731 + 0.731, {6,7}: 0.538: expert 2
    # has the best score, but its group is not kept.
    assert ids.tolist() == [[4, 5]]
    assert torch.allclose(weights, torch.sigmoid(torch.tensor([[1.0, 1.0]])))


def test_c_abi_plan_and_run_checks_through_ctypes():
    shape = _lib.Shape(64, 2048, 512, 256, 8, _lib.MODE_FFN, _lib.DTYPE_FP8)
    plan = _lib.Plan(shape, _lib.default_routing(), _lib.default_options(), "h200")
    assert plan.max_tokens == 64 and plan.workspace_bytes > 0
    assert "launches by token count" in plan.describe()
    w = _lib.Weights(0x100000, 0x200000, 0x300000, 0x400000)
    plan.run(w, _lib.Inputs(0, 0x500000, 0x600000, 0, 0, 0), 0x700000, 0x800000, 0)  # T = 0: nothing launched
    with pytest.raises(ValueError, match="hidden must be 16-byte aligned"):
        plan.run(w, _lib.Inputs(64, 0x500008, 0x600000, 0, 0, 0), 0x700000, 0x800000, 0)
    with pytest.raises(ValueError, match="tokens = 65"):
        plan.run(w, _lib.Inputs(65, 0x500000, 0x600000, 0, 0, 0), 0x700000, 0x800000, 0)
    bad = _lib.Shape(64, 2048, 512, 256, 8, 5, _lib.DTYPE_FP8)
    with pytest.raises(ValueError, match="mode"):
        _lib.Plan(bad, _lib.default_routing(), _lib.default_options(), "h200")


def test_ops_pass_opcheck_on_meta_tensors_and_out_compiles():
    a = meta_layer()
    args = (a["hidden"], a["w13"], a["w2"], a["w13_scale"], a["w2_scale"], a["router_logits"], None, None, None, 2,
            True, "softmax", 0.0, 1, 1, 1.0, False)
    out = torch.empty(5, 256, dtype=torch.bfloat16, device="meta")
    for op, op_args in ((torch.ops.loom.fused_moe.default, args), (torch.ops.loom.fused_moe_out.default, (out,) + args)):
        results = torch.library.opcheck(op, op_args)
        assert all(v == "SUCCESS" for v in results.values()), results
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    torch._dynamo.reset()

    def layer(hidden, w13, w2, w13_scale, w2_scale, router_logits, out):
        loom.fused_moe(hidden, w13, w2, w13_scale=w13_scale, w2_scale=w2_scale, router_logits=router_logits, topk=2,
                       out=out)
        return out * 2

    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=True)
    assert compiled(**a, out=out).shape == (5, 256)
    assert counter.frame_count == 1


def test_expert_parallel_needs_a_process_group():
    import loom.dist as ldist
    reason = ldist.available()
    assert reason is None or "libloom_dist" in reason, reason
    with pytest.raises(RuntimeError, match="process group"):
        ldist.ExpertParallel(experts=16, topk=4, hidden=1024, inter=512, max_tokens=8)
