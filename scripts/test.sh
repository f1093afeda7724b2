#!/usr/bin/env bash
# Sets everything up from nothing, lints, type-checks and runs the whole test suite
# (browser tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/install_browser.sh
.venv/bin/python -m ruff check .
.venv/bin/python scripts/typecheck.py
# One worker per core (pytest-xdist); each file runs whole on one worker, so its module
# fixtures and recordings are made once; files go out in collection order, where
# tests/conftest.py puts those with slow tests first. `-n 0` runs it in one process.
.venv/bin/python -m pytest -n logical --dist loadfile --no-loadscope-reorder "$@"
