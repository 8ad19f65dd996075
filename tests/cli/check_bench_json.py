"""Checks that a `loom bench --json` file is valid JSON with the fields the benchmark promises."""
import json
import sys

records = json.load(open(sys.argv[1]))
assert isinstance(records, list) and records, "expected a non-empty array of records"
for r in records:
    for key in ("tool", "commit", "preset", "device", "shape", "routing", "distribution", "seed", "path",
                "config", "gemm_config", "launches", "metrics", "timings", "sol", "derived", "note"):
        assert key in r, f"record lacks '{key}'"
    for key in ("tokens", "hidden", "inter", "experts", "topk", "mode", "dtype"):
        assert key in r["shape"], f"shape lacks '{key}'"
    for key in ("flops", "experts_hit", "weight_bytes", "activation_bytes", "bytes"):
        assert key in r["metrics"], f"metrics lacks '{key}'"
    assert "measured" in r["sol"]
    if r["sol"]["measured"]:
        for key in ("read", "gemm", "floor_us", "bound"):
            assert key in r["sol"], f"sol lacks '{key}'"
    else:
        assert r["sol"]["why_not"], "an unmeasured SoL must say why"
    if r["path"] == "gpu" and r["shape"]["tokens"] > 0:
        assert r["gemm_config"] and r["launches"], "a GPU record names the GEMM config and launches it ran"
    if r["path"] == "cpu-reference":
        # A CPU time is never presented as a GPU result.
        assert not r["timings"], "CPU path must not report GPU timings"
    t, k = r["shape"]["tokens"], r["shape"]["topk"]
    n, kk = r["shape"]["inter"], r["shape"]["hidden"]
    if r["shape"]["mode"] == "single":
        assert abs(r["metrics"]["flops"] - 2 * t * k * n * kk) <= 1e-6 * max(1, r["metrics"]["flops"])
print(f"{len(records)} records ok")
