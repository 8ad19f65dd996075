#!/usr/bin/env bash
# The test command: build, run the whole suite through CTest, build a CMake consumer against the
# installed tree, and install and test the Python package. GPU tests skip (and are reported as
# skipped) on a machine without an sm_90 GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
# The installed tree from a user's CMake project (find_package(loom), loom::loom; C and C++).
scripts/test-install.sh
# The Python package, installed with pip into a virtual environment (scripts/test-python.sh).
scripts/test-python.sh
