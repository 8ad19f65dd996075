#!/usr/bin/env bash
# Configure and build loom (Release, every kernel for sm_90a) into ${BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
