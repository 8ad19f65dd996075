#!/usr/bin/env bash
# compute-sanitizer over every GPU test, each test in its own process under each tool, several at a
# time on the one GPU (the tools' host-side work and the CPU references overlap), the slowest tests
# first, within a time budget. Called by scripts/gpu-check.sh; usable alone:
#   scripts/sanitize.sh LOGDIR TIMES TEST_BINARY...
# LOGDIR gets one log per (tool, test) under LOGDIR/<tool>/ and results.tsv (tool, test, outcome,
# seconds); TIMES is a gtest log of a plain run whose "(N ms)" orders the jobs (may be empty).
#   SANITIZE         tools (default "memcheck synccheck racecheck")
#   SANITIZE_FILTER  which GPU tests (gtest filter, default every GPU test)
#   SANITIZE_SECONDS the whole run's budget in seconds (default 480; what is left unrun is reported)
#   SANITIZE_JOBS    processes at a time (default 6)
# Tests run with LOOM_SANITIZER=<tool> in the environment: under it the heaviest tests take their
# smaller case lists and timing bounds are not asserted (tests/gpu_test.hpp).
set -uo pipefail
logdir=$1 times=$2
shift 2
mkdir -p "$logdir"
results=$logdir/results.tsv
: > "$results"
deadline=$(( $(date +%s) + ${SANITIZE_SECONDS:-480} ))
export deadline results logdir

# One job: tool, binary, test. Outcomes: clean, errors (the tool's exit code 9), test-failed (the
# test's own failure under the tool, the tool's summary in the log), timeout, unrun (budget spent).
sanitize_one() {
  local tool=$1 bin=$2 test=$3 log="$logdir/$1/$3.log" start left rc outcome
  start=$(date +%s)
  left=$(( deadline - start ))
  if [ "$left" -le 5 ]; then printf '%s\t%s\tunrun\t0\n' "$tool" "$test" >> "$results"; return; fi
  # NCCL's communicator set-up asks CUDA about kernels it has no image for on this GPU
  # (cudaFuncGetAttributes -> cudaErrorNoKernelImageForDevice, 8 times a communicator): API errors
  # inside NCCL, not loom's, so the tests that make communicators run without API-error reports
  # (loom's own calls are checked by the tests themselves: LOOM_CUDA_CHECK).
  local extra=()
  case $test in EpLayerGpu.*) extra=(--report-api-errors no) ;; esac
  LOOM_SANITIZER=$tool timeout "$left" compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
    "${extra[@]}" "$bin" --gtest_filter="$test" > "$log" 2>&1
  rc=$?
  case $rc in
    0) outcome=clean ;; 9) outcome=errors ;; 124) outcome=timeout ;; *) outcome="test-failed(rc=$rc)" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$tool" "$test" "$outcome" "$(( $(date +%s) - start ))" >> "$results"
}
export -f sanitize_one

tools=${SANITIZE-memcheck synccheck racecheck}
jobs=$(mktemp)
for bin in "$@"; do
  # Every GPU test (suites named *Gpu), with its plain run's milliseconds where known.
  "$bin" --gtest_filter="${SANITIZE_FILTER:-*}" --gtest_list_tests |
    awk '/^[^ ]/ { suite = $1 } /^  / && suite ~ /Gpu\.$/ { print suite $1 }' |
    while read -r test; do
      ms=$(grep -F "[       OK ] $test (" "$times" 2>/dev/null | sed -n 's/.*(\([0-9]*\) ms)$/\1/p' | head -1)
      for tool in $tools; do
        # racecheck is the slowest tool: its jobs start first at equal plain time.
        factor=1; [ "$tool" = racecheck ] && factor=4
        weight=$(( ${ms:-1000} * factor ))
        printf '%s\t%s\t%s\t%s\n' "$weight" "$tool" "$bin" "$test"
      done
    done
done | sort -t $'\t' -k1,1nr > "$jobs"
for tool in $tools; do mkdir -p "$logdir/$tool"; done
cut -f2- "$jobs" | tr '\t' '\n' | xargs -d '\n' -n 3 -P "${SANITIZE_JOBS:-6}" bash -c 'sanitize_one "$@"' _
rm -f "$jobs"

# One line per tool, then every test not clean.
for tool in $tools; do
  awk -F '\t' -v t="$tool" '$1 == t { n[$3 ~ /^test-failed/ ? "test-failed" : $3]++ }
    END { printf "%s: clean=%d errors=%d test-failed=%d timeout=%d unrun=%d\n", t, n["clean"], n["errors"],
          n["test-failed"], n["timeout"], n["unrun"] }' "$results"
done
awk -F '\t' '$3 != "clean" { print "  " $1 " " $3 ": " $2 }' "$results" | sort
