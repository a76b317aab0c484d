#!/usr/bin/env bash
# Creates benchmarks/validation/aiconfigurator/.venv with NVIDIA AIConfigurator installed.
# AIConfigurator is NOT a dependency of the simulator: it lives only in this venv.
# Usage: bash benchmarks/validation/aiconfigurator/setup_venv.sh [version]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="${1:-0.12.0}"
python3 -m venv "$here/.venv"
# PIP_CONSTRAINT is cleared: the system-wide constraints pin the simulator's own
# environment, not this one.
PIP_CONSTRAINT="" "$here/.venv/bin/pip" install --quiet "aiconfigurator==${version}"
"$here/.venv/bin/python" -c "import importlib.metadata as m; print('aiconfigurator', m.version('aiconfigurator'))"
