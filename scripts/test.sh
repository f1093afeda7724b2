#!/usr/bin/env bash
# Sets everything up from nothing, lints, type-checks and runs the whole test suite
# (browser tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/install_browser.sh
# Each Python process the suite starts (test workers, recordings, torchrun ranks, fresh
# `neuron-explorer` runs) imports the project: from source, that is 2 s of compiling a
# process. Bytecode is written once, here, and read by every process after (git ignores it).
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 backend collectors common explorer webapp workloads \
    tests > /dev/null
.venv/bin/python -m ruff check .
.venv/bin/python scripts/typecheck.py
# One worker per core (pytest-xdist); each file runs whole on one worker, so its module
# fixtures and recordings are made once; files go out in collection order, where
# tests/conftest.py puts those with slow tests first. `-n 0` runs it in one process.
.venv/bin/python -m pytest -n logical --dist loadfile --no-loadscope-reorder "$@"
