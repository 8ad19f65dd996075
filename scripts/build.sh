#!/usr/bin/env bash
# Configure and build loom (Release, every kernel for sm_90a) and its lab (LAB=OFF: without) into
# ${BUILD_DIR:-build}.
# TRACE=1 configures a new build folder with the chain tracer's stamps (-DLOOM_CHAIN_TRACE=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_LAB=${LAB:-ON} \
    ${TRACE:+-DLOOM_CHAIN_TRACE=ON}
fi
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
