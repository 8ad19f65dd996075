#!/usr/bin/env bash
# A/B timing of expert parallelism's stages on the GPU machine: each round runs every binary once
# per workload (so slow drift hits all alike) and prints rank 0's rows of `loom bench --ep N`
# (T, parts, rank, e2e [p10, p90], dispatch, local, combine, ...; µs, graph replays, cold L2).
#   lab/scripts/ep-ab.sh BINARY...   e.g. build/old_loom build/tools/loom (an old commit's `loom`,
#                                    built in a git worktree and carried)
#   RUNS    ';'-separated bench arguments (default: qwen35-layer at T 128,4096; h200-bf16 at 1,64)
#   EP      ranks (default 1); ROUNDS (default 2)
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} NCCL_NVLS_ENABLE=0
IFS=';' read -r -a runs <<< "${RUNS:---preset qwen35-layer --tokens 128,4096;--preset h200-bf16 --tokens 1,64}"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for bin in "$@"; do
    for run in "${runs[@]}"; do
      echo "== r$r $bin $run"
      # shellcheck disable=SC2086
      "$bin" bench --ep "${EP:-1}" $run 2>&1 | grep -E '^ +[0-9]+ +[0-9]+ +0 |rror'
    done
  done
done
