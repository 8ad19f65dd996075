#!/usr/bin/env bash
# Chain-trace A/B on the GPU machine: for each round, variant and T, the chain trace's key points
# (`loom bench --trace-chain`: µs after the first stamp, medians over the traced replays; first /
# last CTA, then the CTAs' 10th / 50th / 90th percentile where the tracer prints them) and the e2e
# of the trace build (stamps included, so slower than a plain build's).
#   VARIANTS  as in lab/scripts/ab.sh (lab/scripts/variant.sh): "name", "name:ENV=v,ENV2=w", "name+--flag";
#             the binary (exp/<name>/tools/loom, else $BUILD/tools/loom) must be a trace build
#             (TRACE=1 BUILD_DIR=<dir> scripts/build.sh configures one).
#   BUILD (default build-trace), TOKENS (default 1,8), ROUNDS (2), REPS (traced replays, 50),
#   POINTS    extended regex of the trace lines to print (default: the hand-off points below).
# Example: VARIANTS="base new" TOKENS=1,8 lab/scripts/trace-ab.sh   (exp/base, exp/new: trace builds)
set -u
cd "$(dirname "$0")/../.."
source lab/scripts/variant.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
build=${BUILD:-build-trace}
points=${POINTS:-'small: (waited|routed|layout|routing CTA end|quantise CTAs end)|token 0: |gemm: (start|waited|units|first weight|end) |loom e2e'}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in ${VARIANTS:-base}; do
    parse_variant "$v" "$build"
    for t in $(echo "${TOKENS:-1,8}" | tr , " "); do
      echo "== r$r $label T=$t"
      # shellcheck disable=SC2086
      env $envs "$bin" bench --preset qwen35-single --tokens "$t" --reps "${REPS:-50}" --no-sol --no-check \
        --trace-chain "${REPS:-50}" $args 2>&1 | grep -E "$points|rror"
    done
  done
done
