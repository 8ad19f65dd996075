"""Expert parallelism from PyTorch (loom.dist.ExpertParallel): one rank of a one-process group
(the whole path, its own rows written in place) against loom.fused_moe with deterministic=True,
bit for bit in BF16 when deterministic (within tolerance when the owners sum their routes),
eagerly and from a CUDA graph; its refusals; and with two
GPUs or more, two processes whose outputs equal the one-GPU layer's on their tokens."""

import os
import tempfile

import pytest
import torch

import loom

from conftest import gpu_reason

dist = pytest.importorskip("torch.distributed")


def _reason():
    if gpu_reason() is not None:
        return gpu_reason()
    if not dist.is_available():
        return "torch.distributed is not available"
    import loom.dist as ldist
    return ldist.available()


requires_ep = pytest.mark.skipif(_reason() is not None, reason=f"GPU test skipped: {_reason()}")
pytestmark = requires_ep


def make_layer(T, H, I, E, bf16, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, device="cuda")  # noqa: E731
    w13, w2 = randn(E, 2 * I, H) * H ** -0.5, randn(E, H, I) * I ** -0.5
    if bf16:
        layer = dict(w13=w13.to(torch.bfloat16), w2=w2.to(torch.bfloat16), w13_scale=None, w2_scale=None)
    else:
        q13, s13 = loom.quantize_weights_fp8(w13, segments=2)
        q2, s2 = loom.quantize_weights_fp8(w2)
        layer = dict(w13=q13, w2=q2, w13_scale=s13, w2_scale=s2)
    layer.update(hidden=randn(T, H).to(torch.bfloat16), router_logits=randn(T, E))
    return layer


def local_weights(layer, experts):
    idx = torch.tensor(experts, device="cuda")
    pick = lambda t: None if t is None else t.index_select(0, idx).contiguous()  # noqa: E731
    return {k: pick(layer[k]) for k in ("w13", "w2", "w13_scale", "w2_scale")}


@pytest.fixture
def one_rank_group():
    store = tempfile.NamedTemporaryFile(delete=False)
    store.close()
    os.unlink(store.name)
    dist.init_process_group("gloo", init_method=f"file://{store.name}", world_size=1, rank=0)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("bf16", [True, False])
def test_one_rank_equals_the_layer(one_rank_group, bf16):
    import loom.dist as ldist
    T, H, I, E, k = 40, 1024, 512, 16, 4
    layer = make_layer(T, H, I, E, bf16, seed=11)
    wants = {det: loom.fused_moe(layer["hidden"], layer["w13"], layer["w2"], w13_scale=layer["w13_scale"],
                                 w2_scale=layer["w2_scale"], router_logits=layer["router_logits"], topk=k,
                                 deterministic=det) for det in (True, False)}
    for chunks, det in ((1, True), (2, True), (1, False)):
        want = wants[det]  # the owners' sums against the one-GPU layer's fast mode (the same roundings)
        ep = ldist.ExpertParallel(experts=E, topk=k, hidden=H, inter=I, max_tokens=64,
                                  dtype="bf16" if bf16 else "fp8", chunks=chunks, deterministic=det)
        assert ep.local_experts == list(range(E))
        w = local_weights(layer, ep.local_experts)
        out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
        got = ep(layer["hidden"], w["w13"], w["w2"], w13_scale=w["w13_scale"], w2_scale=w["w2_scale"],
                 router_logits=layer["router_logits"], out=out)
        torch.cuda.synchronize()
        assert got.data_ptr() == out.data_ptr()
        if bf16 and det:
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"chunks {chunks}: differs"
        else:  # FP8, or the owners' sums: within tolerance
            err = ((got.double() - want.double()).norm() / want.double().norm()).item()
            assert err <= 2e-3, (chunks, err)
        assert ep.status() == {"nan_tokens": 0, "dropped_routes": 0, "overflow_routes": 0}
        # From a CUDA graph: the same bits.
        replay = torch.full_like(out, float("nan"))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ep(layer["hidden"], w["w13"], w["w2"], w13_scale=w["w13_scale"], w2_scale=w["w2_scale"],
               router_logits=layer["router_logits"], out=replay)
        graph.replay()
        torch.cuda.synchronize()
        if det:
            assert torch.equal(replay.view(torch.int16), got.view(torch.int16)), f"chunks {chunks}: the replay differs"
        else:
            err = ((replay.double() - want.double()).norm() / want.double().norm()).item()
            assert err <= 2e-3, ("replay", chunks, err)
        del graph  # NCCL's communicator outlives no graph that captured its calls (close() waits for them)
        # No tokens: the rank still takes part, nothing is written.
        none = ep(layer["hidden"][:0], w["w13"], w["w2"], w13_scale=w["w13_scale"], w2_scale=w["w2_scale"],
                  router_logits=layer["router_logits"][:0])
        assert none.shape == (0, H)
        ep.close()


def test_refusals(one_rank_group):
    import loom.dist as ldist
    T, H, I, E, k = 8, 1024, 512, 16, 4
    layer = make_layer(T, H, I, E, True, seed=3)
    ep = ldist.ExpertParallel(experts=E, topk=k, hidden=H, inter=I, max_tokens=8, dtype="bf16")
    w = local_weights(layer, ep.local_experts[:-1])  # one expert short
    with pytest.raises(ValueError, match="experts"):
        ep(layer["hidden"], w["w13"], w["w2"], router_logits=layer["router_logits"])
    w = local_weights(layer, ep.local_experts)
    with pytest.raises(ValueError, match="hidden"):
        big = torch.zeros((9, H), dtype=torch.bfloat16, device="cuda")  # beyond max_tokens
        ep(big, w["w13"], w["w2"], router_logits=torch.zeros((9, E), device="cuda"))
    ep.close()
    with pytest.raises(RuntimeError, match="closed"):
        ep(layer["hidden"], w["w13"], w["w2"], router_logits=layer["router_logits"])
    with pytest.raises(ValueError):
        ldist.ExpertParallel(experts=E, topk=k, hidden=H, inter=I, max_tokens=8, expert_rank=[1] * E)  # rank 1 of 1
    with pytest.raises(ValueError):
        ldist.ExpertParallel(experts=E, topk=k, hidden=H, inter=I, max_tokens=8, chunks=0)


def _rank_main(rank, size, store, result_dir):
    import loom.dist as ldist
    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method=f"file://{store}", world_size=size, rank=rank)
    T, H, I, E, k = 24 + 8 * rank, 1024, 512, 16, 4
    layer = make_layer(T, H, I, E, True, seed=100 + rank)
    full = make_layer(1, H, I, E, True, seed=5)  # the weights every rank shares
    for key in ("w13", "w2"):
        layer[key] = full[key]
    want = loom.fused_moe(layer["hidden"], layer["w13"], layer["w2"], router_logits=layer["router_logits"], topk=k,
                          deterministic=True)
    ep = ldist.ExpertParallel(experts=E, topk=k, hidden=H, inter=I, max_tokens=64, dtype="bf16", deterministic=True)
    w = local_weights(layer, ep.local_experts)
    got = ep(layer["hidden"], w["w13"], w["w2"], router_logits=layer["router_logits"])
    torch.cuda.synchronize()
    same = torch.equal(got.view(torch.int16), want.view(torch.int16))
    with open(os.path.join(result_dir, f"rank{rank}"), "w") as f:
        f.write("equal" if same else "differs")
    ep.close()
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="GPU test skipped: needs two GPUs or more")
def test_two_ranks_equal_the_layer():
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        mp.spawn(_rank_main, args=(2, store, d), nprocs=2, join=True)
        for r in range(2):
            with open(os.path.join(d, f"rank{r}")) as f:
                assert f.read() == "equal", f"rank {r} differs from the one-GPU layer"
