#!/usr/bin/env bash
# The Python package's tests: installs it with pip from this checkout into a virtual environment
# (${VENV:-build/venv}, made on first use, with torch and pytest from PyPI), then runs pytest. GPU
# tests skip themselves without an sm_90 GPU. On a machine without PyPI (the GPU machine), run
# pytest on the source tree instead: PYTHONPATH=python LOOM_LIBRARY=build/src/libloom.so.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(realpath -m "${VENV:-build/venv}")
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -c "import torch, pytest" 2>/dev/null || "$venv/bin/pip" install -q torch pytest
"$venv/bin/pip" install -q .
# From the tests' folder, so `import loom` is the installed package, not python/loom.
cd python/tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$@"
