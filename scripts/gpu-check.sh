#!/usr/bin/env bash
# One-call GPU check, for a machine with an H200 and an existing build (built elsewhere and carried,
# or by scripts/build.sh): the tests (every GPU suite in its own process), compute-sanitizer's
# memcheck, synccheck and racecheck over every GPU test, `loom peaks`, the lab's probes, and the
# benchmark runs that docs/perf/current.md is generated from. Logs and JSON go to
# $OUT/gpu-check.tar.gz (or ./out), current.md beside it; a short table is printed last.
#   BUILD_DIR        build folder (default build)
#   GTEST_FILTER     which tests to run (default all; '-' skips the tests)
#   SANITIZE         tools to run over every GPU test (default "memcheck synccheck racecheck"; '' none)
#   SANITIZE_FILTER, SANITIZE_SECONDS, SANITIZE_JOBS: see scripts/sanitize.sh
#   SKIP_PEAKS       set: skip `loom peaks`
#   SKIP_PYTHON      set: skip the Python package's pytest, tools/torch_bench.py, the example and
#                    tools/bf16_peers.py (after the bench runs; run where torch is)
#   SKIP_SKELETON    set: skip the lab's probes (`loom-lab skeleton`, `gather-probe`, `stream-probe`,
#                    `warp-probe`, `bf16-variants`; ~60 s; a build with the lab only)
#   CHECK_BENCH      `loom bench` runs, ';'-separated argument lists (default: docs/perf/current.md's;
#                    '-' none)
#   CHECK_EP         `loom bench --ep <every GPU>` runs, ';'-separated (default: the qwen35-layer and
#                    h200-bf16 rows of current.md's expert-parallelism tables, both combine modes;
#                    '-' none; a build with NCCL only)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
out=${OUT:-out}
mkdir -p "$out/logs"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NVLink multicast off in every NCCL communicator the tests create (expert parallelism's).
export NCCL_NVLS_ENABLE=0
loom=$build/tools/loom
lab=$build/lab/loom-lab
test_bins=("$build/tests/loom_tests")
[ -x "$build/lab/loom_lab_tests" ] && test_bins+=("$build/lab/loom_lab_tests")
summary=$out/logs/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  command -v ncu >/dev/null && ncu --version | tail -1
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -1
} > "$out/logs/machine.txt" 2>&1

# "Suite.Test1:Suite.Test2" per GPU suite of a test binary, from the tests a filter selects.
gpu_suites() {
  "$1" --gtest_filter="$2" --gtest_list_tests |
    awk '/^[^ ]/ { suite = $1 } /^  / && suite ~ /Gpu\.$/ { t[suite] = t[suite] (t[suite] ? ":" : "") suite $1 }
         END { for (s in t) print t[s] }'
}

# CPU tests in one process; each GPU suite in its own, so one crashed kernel (a sticky CUDA error)
# cannot fail the suites after it.
filter=${GTEST_FILTER:-*}
: > "$out/logs/tests.log"
if [ "$filter" != "-" ]; then
  test_rc=0
  for tests in "${test_bins[@]}"; do
    "$tests" --gtest_filter="$filter:-*Gpu.*" >> "$out/logs/tests.log" 2>&1 || test_rc=1
    while read -r selection; do
      "$tests" --gtest_filter="$selection" >> "$out/logs/tests.log" 2>&1 || test_rc=1
    done < <(gpu_suites "$tests" "$filter")
  done
  passed=$(grep -c '^\[       OK \]' "$out/logs/tests.log")
  failed=$(grep -c '^\[  FAILED  \] [A-Za-z].*(' "$out/logs/tests.log")
  skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z].*(' "$out/logs/tests.log")
  gpu_ran=$(grep '^\[       OK \]' "$out/logs/tests.log" | grep -c 'Gpu\.')
  note "tests: rc=$test_rc passed=$passed failed=$failed skipped=$skipped (GPU tests passed: $gpu_ran)"
  grep '^\[  FAILED  \] [A-Za-z].*(' "$out/logs/tests.log" | sort -u | tee -a "$summary"
fi

# The Python package on the source tree (the GPU machine has no PyPI for `pip install`): pytest
# with the built library, then the front's cost against `loom bench` (tools/torch_bench.py).
if [ -z "${SKIP_PYTHON:-}" ] && python3 -c "import torch, pytest" 2>/dev/null; then
  LOOM_LIBRARY=$PWD/$build/src/libloom.so PYTHONPATH=$PWD/python \
    python3 -m pytest -q -p no:cacheprovider -rs python/tests > "$out/logs/pytest.log" 2>&1
  note "pytest: rc=$? $(tail -1 "$out/logs/pytest.log")"
  LOOM_LIBRARY=$PWD/$build/src/libloom.so PYTHONPATH=$PWD/python \
    python3 tools/torch_bench.py --loom "$loom" --json "$out/logs/torch_bench.json" > "$out/logs/torch_bench.txt" 2>&1
  note "torch_bench: rc=$?"
  cat "$out/logs/torch_bench.txt" >> "$summary"
  LOOM_LIBRARY=$PWD/$build/src/libloom.so PYTHONPATH=$PWD/python \
    python3 examples/torch_moe_layer.py > "$out/logs/example.txt" 2>&1
  note "example: rc=$? $(tail -1 "$out/logs/example.txt")"
fi

# compute-sanitizer over every GPU test (scripts/sanitize.sh: a process per test and tool, several
# at a time, within SANITIZE_SECONDS).
if command -v compute-sanitizer >/dev/null && [ -n "${SANITIZE-memcheck synccheck racecheck}" ]; then
  scripts/sanitize.sh "$out/logs/sanitize" "$out/logs/tests.log" "${test_bins[@]}" | tee -a "$summary"
fi

if [ -z "${SKIP_PEAKS:-}" ]; then
  "$loom" peaks --json "$out/logs/peaks.json" > "$out/logs/peaks.txt" 2> "$out/logs/peaks.err"
  note "peaks: rc=$?"
fi

if [ -z "${SKIP_SKELETON:-}" ] && [ -x "$lab" ]; then
  for probe in skeleton gather-probe stream-probe warp-probe bf16-variants; do
    "$lab" "$probe" > "$out/logs/$probe.txt" 2> "$out/logs/$probe.err"
    note "$probe: rc=$?"
  done
fi

# The runs docs/perf/current.md shows: the T sweep; deterministic, PDL-off and eager variants;
# skewed distributions; the same for the ffn layer (qwen35-layer); the glue where few experts make
# its bins contend (H 4096, E 8, k 2).
runs=()
[ "${CHECK_BENCH:-}" != "-" ] && IFS=';' read -r -a runs <<< "${CHECK_BENCH:---preset qwen35-single --tokens 1,8,32,128,512,2048,8192;--preset qwen35-single --tokens 1,128,2048 --deterministic;--preset qwen35-single --tokens 1,128 --no-pdl --no-check;--preset qwen35-single --tokens 1,128 --eager --no-check;--preset qwen35-single --dist zipf:1.2 --no-check;--preset qwen35-single --dist hot:0.9 --no-check;--preset qwen35-single --dist concentrated --no-check;--preset qwen35-layer --tokens 1,8,32,128,512,2048,8192;--preset qwen35-layer --tokens 1,8,32,128,512,2048,8192 --deterministic;--preset qwen35-layer --tokens 1,128,2048,8192 --dist zipf:1.2 --no-check;--preset qwen35-layer --tokens 1,128,2048,8192 --dist hot:0.9 --no-check;--preset qwen35-single --hidden 4096 --experts 8 --topk 2 --tokens 1,128,4096,16384 --no-check;--preset h200-bf16 --tokens 1,64,512,2048,8192,32768;--preset h200-bf16 --tokens 8192 --deterministic;--preset h200-bf16 --tokens 8192 --dist balanced --no-check;--preset h200-bf16 --tokens 8192 --dist zipf:1.2 --no-check;--preset h200-bf16 --tokens 8192 --dist hot:0.5 --no-check}"
: > "$out/logs/bench-manifest.tsv"
i=0
for run in "${runs[@]}"; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  "$loom" bench $run --json "$out/logs/bench$i.json" > "$out/logs/bench$i.txt" 2> "$out/logs/bench$i.err"
  note "bench$i ($run): rc=$?"
  printf 'bench%s.json\t%s\n' "$i" "$run" >> "$out/logs/bench-manifest.tsv"
done
# Expert parallelism over every GPU of this machine (one process a GPU; issue 49).
eps=()
[ "${CHECK_EP:-}" != "-" ] && "$loom" help 2>&1 | grep -q -- "--ep N" &&
  IFS=';' read -r -a eps <<< "${CHECK_EP:---preset qwen35-layer --tokens 128,4096 --ep-chunks 1,2;--preset qwen35-layer --tokens 128,4096 --deterministic;--preset h200-bf16 --tokens 1,64,2048;--preset h200-bf16 --tokens 1,64,2048 --deterministic}"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
e=0
: > "$out/logs/ep-manifest.tsv"
for run in "${eps[@]}"; do
  e=$((e + 1))
  # shellcheck disable=SC2086
  "$loom" bench --ep "$gpus" $run > "$out/logs/ep$e.txt" 2> "$out/logs/ep$e.err"
  note "ep$e (--ep $gpus $run): rc=$?"
  printf 'ep%s.txt\t--ep %s %s\n' "$e" "$gpus" "$run" >> "$out/logs/ep-manifest.tsv"
done
# The BF16 layer's peers (issue 47) on the preset h200-bf16's shape, beside loom's rows of the
# same shape where a bench run above measured them.
if [ -z "${SKIP_PYTHON:-}" ] && python3 -c "import torch" 2>/dev/null; then
  bf16_json=$(awk -F'\t' '$2 ~ /--preset h200-bf16/ && $2 !~ /--(hidden|inter|experts|topk) / { print $1; exit }' \
    "$out/logs/bench-manifest.tsv")
  python3 tools/bf16_peers.py ${bf16_json:+--loom-json "$out/logs/$bf16_json"} --json "$out/logs/bf16_peers.json" \
    > "$out/logs/bf16_peers.txt" 2>&1
  note "bf16_peers: rc=$?"
  cat "$out/logs/bf16_peers.txt" >> "$summary"
fi
if [ "$i" -gt 0 ]; then
  python3 scripts/perf_current.py "$out/logs/bench-manifest.tsv" > "$out/current.md" 2> "$out/logs/current.err"
  note "current.md: rc=$?"
fi

tar -C "$out" -czf "$out/gpu-check.tar.gz" logs
cp "$out/logs/summary.txt" "$out/summary.txt"
rm -rf "$out/logs"
for f in peaks skeleton gather-probe stream-probe warp-probe; do tar -xzOf "$out/gpu-check.tar.gz" "logs/$f.txt" 2>/dev/null; done
for j in $(seq 1 $i); do tar -xzOf "$out/gpu-check.tar.gz" "logs/bench$j.txt" 2>/dev/null; done
for j in $(seq 1 $e); do tar -xzOf "$out/gpu-check.tar.gz" "logs/ep$j.txt" 2>/dev/null; done
echo "---- summary"
cat "$out/summary.txt"
