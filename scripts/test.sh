#!/usr/bin/env bash
# The whole test suite, as CI runs it: install what is missing (brokers from Debian's packages,
# Python packages into .venv), then lint (ruff), type-check (mypy --strict) and run pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/protocol -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff" && .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy" && .venv/bin/mypy
echo "== pytest" && exec .venv/bin/python -m pytest "$@"
