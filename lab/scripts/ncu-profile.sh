#!/usr/bin/env bash
# Profiles the pipeline's kernels with Nsight Compute on a GPU machine (existing build, as for
# gpu-check.sh). Per T in PROFILE_TOKENS (default "2048 8192"): one GEMM launch with the stall,
# memory and source sections (report + SASS source page as CSV), and every kernel of one graph
# replay with the speed-of-light section (their durations). Output under $OUT (or ./out).
#   PROFILE_PRESET the workload (default qwen35-single); PROFILE_ARGS extra `loom bench` arguments
#                  (e.g. "--dist zipf:1.2")
#   PROFILE_KERNEL kernel name regex for the detailed pass (default gemm_fp8)
#   PROFILE_SKIP / PROFILE_COUNT  matching launches skipped / profiled in the detailed pass (3 / 1;
#                  the glue kernels of one run: PROFILE_KERNEL='route|dispatch|quant' PROFILE_SKIP=0
#                  PROFILE_COUNT=3)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
loom=${BUILD_DIR:-build}/tools/loom
kernel=${PROFILE_KERNEL:-gemm_fp8}
for t in ${PROFILE_TOKENS:-2048 8192}; do
  bench=(bench --preset "${PROFILE_PRESET:-qwen35-single}" --tokens "$t" --no-sol --no-check ${PROFILE_ARGS:-})
  ncu --clock-control none -k "regex:$kernel" -s "${PROFILE_SKIP:-3}" -c "${PROFILE_COUNT:-1}" \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy \
    --export "$out/detail-$t" \
    "$loom" "${bench[@]}" --reps 5 --warmup 1 > "$out/detail-$t.txt" 2>&1
  ncu --import "$out/detail-$t.ncu-rep" --page details > "$out/detail-$t.details.txt" 2>&1
  ncu --import "$out/detail-$t.ncu-rep" --page source --print-source sass --csv > "$out/detail-$t.sass.csv" 2>&1
  ncu --clock-control none -s 0 -c 12 --section SpeedOfLight "$loom" "${bench[@]}" --reps 1 --warmup 0 \
    > "$out/kernels-$t.txt" 2>&1
  echo "== T=$t $kernel"
  grep -E "^    (Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit Rate|L2 Hit Rate|Mem Busy|Max Bandwidth|L2 Cache Throughput|Issued Ipc Active|No Eligible|Warp Cycles Per Issued)" \
    "$out/detail-$t.details.txt"
  echo "== T=$t kernels (name, duration)"
  awk '/^  [A-Za-z_].*\(/ { name = match($0, /[A-Za-z0-9_]+(<[^(]*>)?\(/) ? substr($0, RSTART, RLENGTH - 1) : $1 }
       /^    Duration/ { print "  " name, $(NF-1), $NF }' "$out/kernels-$t.txt"
done
