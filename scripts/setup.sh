#!/usr/bin/env bash
# Creates .venv with the project installed (editable) and its test tools.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# torch is pinned through constraints.txt: an unpinned torch would pull a CUDA build.
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test]"
