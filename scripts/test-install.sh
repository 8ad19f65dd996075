#!/usr/bin/env bash
# Installs the built tree into a temporary prefix and builds and runs tests/consumer against it
# (find_package(loom), loom::loom, the C++ and the C header). Needs an existing build (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" > "$tmp/install.log"
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S tests/consumer -B "$tmp/build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log" ||
  { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
"$tmp/build/consumer_cpp"
"$tmp/build/consumer_c"
echo "install consumer: passed"
