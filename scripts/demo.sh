#!/usr/bin/env bash
# Sets everything up from nothing, records the sample workload and serves the dashboard.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/neuron-explorer demo "$@"
