#!/usr/bin/env bash
# A/B timing of builds or environment switches on the GPU machine: each round runs every variant
# once (so slow drift hits all alike) and prints, per T, "T:e2e/GEMM-alone/glue" medians in µs
# from `loom bench --no-sol --no-check` (graph replays, cold L2).
#   VARIANTS  space-separated "name", "name:ENV=v,ENV2=w" and/or "name+--flag+--flag2" (bench
#             arguments of that variant). The binary is exp/<name>/tools/loom when that exists,
#             else $BUILD/tools/loom (so a name can also just label a switch).
#   BUILD     default build folder (default build); TOKENS (default 2048,4096,8192); ROUNDS (2);
#   PRESET    the workload (default qwen35-single; qwen35-layer for the ffn layer);
#   REPS      graph replays per median (200); STAGES=1 also prints each stage timed alone (glue;
#             ffn: GEMM 1, SiLU*up, GEMM 2, output);
#   EXTRA     more `loom bench` arguments.
# Example: VARIANTS="base new" TOKENS=128,8192 lab/scripts/ab.sh   (exp/base, exp/new carried)
set -u
cd "$(dirname "$0")/../.."
source lab/scripts/variant.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
build=${BUILD:-build}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in ${VARIANTS:-base}; do
    parse_variant "$v" "$build"
    # shellcheck disable=SC2086
    out=$(env $envs "$bin" bench --preset "${PRESET:-qwen35-single}" --tokens "${TOKENS:-2048,4096,8192}" \
      --reps "${REPS:-200}" --no-sol --no-check ${EXTRA:-} $args 2>&1)
    echo "r$r $label | $(echo "$out" | awk '$1 ~ /^[0-9]+$/ && NF > 8 {printf "%s:%s/%s/%s ", $1, $3, $7, $8}')"
    [ -n "${STAGES:-}" ] && echo "    $(echo "$out" | grep 'stages alone' | sed 's/ *stages alone //' | tr '\n' ' ')"
    echo "$out" | grep -i "error\|fail" | head -3
  done
done
