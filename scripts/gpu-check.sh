#!/usr/bin/env bash
# One-call GPU check, for a machine with an H200 and an existing build (built elsewhere and carried,
# or by scripts/build.sh): tool sanity, the GPU tests (all tests, in fact), `loom peaks`, and the
# benchmark presets. Logs and JSON go under $OUT (or ./out); a short table is printed last.
#   BUILD_DIR   build folder (default build)
#   CHECK_BENCH extra `loom bench` runs, ';'-separated argument lists (default: the presets)
#   GTEST_FILTER which tests to run (default all)
#   SKIP_PEAKS  set: skip `loom peaks`
#   SKIP_SKELETON set: skip the lab's probes: `loom-lab skeleton`, `gather-probe`, `stream-probe`,
#               `warp-probe` (~10 s; a build with the lab only)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
out=${OUT:-out}
mkdir -p "$out/logs"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
loom=$build/tools/loom
lab=$build/lab/loom-lab
summary=$out/logs/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  command -v ncu >/dev/null && ncu --version | tail -1
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -1
} > "$out/logs/machine.txt" 2>&1

# CPU tests in one process; each GPU suite in its own, so one crashed kernel (a sticky CUDA error)
# cannot fail the suites after it.
filter=${GTEST_FILTER:-*}
: > "$out/logs/tests.log"
test_rc=0
for tests in "$build/tests/loom_tests" "$build/lab/loom_lab_tests"; do
  [ -x "$tests" ] || continue
  "$tests" --gtest_filter="$filter:-*Gpu.*" >> "$out/logs/tests.log" 2>&1 || test_rc=1
  # "Suite.Test1:Suite.Test2" per GPU suite, from the tests the filter selects.
  "$tests" --gtest_filter="$filter" --gtest_list_tests |
    awk '/^[^ ]/ { suite = $1 } /^  / && suite ~ /Gpu\.$/ { t[suite] = t[suite] (t[suite] ? ":" : "") suite $1 }
         END { for (s in t) print t[s] }' > "$out/logs/gpu-suites.txt"
  while read -r selection; do
    "$tests" --gtest_filter="$selection" >> "$out/logs/tests.log" 2>&1 || test_rc=1
  done < "$out/logs/gpu-suites.txt"
done
passed=$(grep -c '^\[       OK \]' "$out/logs/tests.log")
failed=$(grep -c '^\[  FAILED  \] [A-Za-z].*(' "$out/logs/tests.log")
skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z].*(' "$out/logs/tests.log")
gpu_ran=$(grep '^\[       OK \]' "$out/logs/tests.log" | grep -c 'Gpu\.')
note "tests: rc=$test_rc passed=$passed failed=$failed skipped=$skipped (GPU tests passed: $gpu_ran)"
grep '^\[  FAILED  \] [A-Za-z].*(' "$out/logs/tests.log" | sort -u | tee -a "$summary"

if [ -n "${SANITIZE_FILTER:-}" ] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/loom_tests" --gtest_filter="$SANITIZE_FILTER" \
    > "$out/logs/memcheck.log" 2>&1
  note "memcheck ($SANITIZE_FILTER): rc=$?"
fi

if [ -z "${SKIP_PEAKS:-}" ]; then
  "$loom" peaks --json "$out/logs/peaks.json" > "$out/logs/peaks.txt" 2> "$out/logs/peaks.err"
  note "peaks: rc=$?"
fi

if [ -z "${SKIP_SKELETON:-}" ] && [ -x "$lab" ]; then
  "$lab" skeleton > "$out/logs/skeleton.txt" 2> "$out/logs/skeleton.err"
  note "skeleton: rc=$?"
  "$lab" gather-probe > "$out/logs/gather-probe.txt" 2> "$out/logs/gather-probe.err"
  note "gather-probe: rc=$?"
  "$lab" stream-probe > "$out/logs/stream-probe.txt" 2> "$out/logs/stream-probe.err"
  note "stream-probe: rc=$?"
  "$lab" warp-probe > "$out/logs/warp-probe.txt" 2> "$out/logs/warp-probe.err"
  note "warp-probe: rc=$?"
fi

# Default: the runs docs/perf.md records (T sweep; deterministic, PDL-off and eager variants;
# skewed distributions).
IFS=';' read -r -a runs <<< "${CHECK_BENCH:---preset qwen35-single --tokens 1,8,32,128,512,2048,4096,8192;--preset qwen35-single --tokens 1,128 --deterministic;--preset qwen35-single --tokens 1,128 --no-pdl --no-check;--preset qwen35-single --tokens 1,128 --eager --no-check;--preset qwen35-single --dist zipf:1.2 --no-check;--preset qwen35-single --dist hot:0.9 --no-check;--preset qwen35-single --dist concentrated --no-check}"
i=0
for run in "${runs[@]}"; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  "$loom" bench $run --json "$out/logs/bench$i.json" > "$out/logs/bench$i.txt" 2> "$out/logs/bench$i.err"
  note "bench$i ($run): rc=$?"
done

tar -C "$out" -czf "$out/gpu-check.tar.gz" logs
cp "$out/logs/summary.txt" "$out/summary.txt"
rm -rf "$out/logs"
tar -xzOf "$out/gpu-check.tar.gz" logs/peaks.txt 2>/dev/null
tar -xzOf "$out/gpu-check.tar.gz" logs/skeleton.txt 2>/dev/null
tar -xzOf "$out/gpu-check.tar.gz" logs/gather-probe.txt 2>/dev/null
tar -xzOf "$out/gpu-check.tar.gz" logs/stream-probe.txt 2>/dev/null
tar -xzOf "$out/gpu-check.tar.gz" logs/warp-probe.txt 2>/dev/null
for j in $(seq 1 $i); do tar -xzOf "$out/gpu-check.tar.gz" "logs/bench$j.txt" 2>/dev/null; done
echo "---- summary"
cat "$out/summary.txt"
