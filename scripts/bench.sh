#!/usr/bin/env bash
# The main job: build, then `loom bench` on the default preset (qwen35-single). Extra arguments go
# to `loom bench` (e.g. --sweep, --json results.json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >&2
exec "${BUILD_DIR:-build}/tools/loom" bench --preset qwen35-single "$@"
