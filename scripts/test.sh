#!/usr/bin/env bash
# The whole test suite, as CI runs it: install what is missing (brokers from Debian's packages,
# Python packages into .venv), then lint (ruff), type-check (mypy --strict) and run pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/protocol -x), for one run.
#
# Without arguments pytest runs twice (docs/testing.md, "Running the tests"): the whole suite
# against the compiled core that setup.sh builds, then the fast tests of the pure code
# (tests/protocol, tests/proxy, tests/config, tests/fuzz: about 1 minute) against the
# pure-Python sources (MQ_SIDECAR_PURE=1); both under coverage.py, whose combined report of
# protocol/, proxy/ and config/, then a report of spark/ (the PySpark data source) of its own,
# end the run (each fails it below its floor). EXPECT_MQ_SIDECAR_CORE (not MQ_SIDECAR_*: the
# sidecar warns about unknown variables with its prefix) makes tests/protocol/
# test_native.py fail when the other build is running. With MQ_SIDECAR_PURE=1 set, setup.sh
# compiles nothing and the one run is pure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff" && .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy" && .venv/bin/mypy
case "${MQ_SIDECAR_PURE:-}" in
"" | 0) core=compiled ;;
*) core=pure ;;
esac
if [ "$#" -gt 0 ] || [ "$core" = pure ]; then
    echo "== pytest ($core core)"
    exec env EXPECT_MQ_SIDECAR_CORE="$core" .venv/bin/python -m pytest "$@"
fi
# Both runs are measured by coverage.py through pytest-cov (settings: pyproject.toml's
# [tool.coverage.*]); the second appends to the first's data. Then two reports of both runs'
# line and branch coverage, each against its floor (below it the run fails): the daemon's
# (protocol/, proxy/, config/; fail_under in pyproject.toml) and the PySpark data source's
# (spark/, SPARK_FLOOR below; only its lines that run in the tests' own processes count: the
# code run by Spark's Python workers is not measured, docs/testing.md, "Coverage").
SPARK_FLOOR=64.0
# Both runs spread whole test files over TEST_WORKERS pytest-xdist processes (2 by default;
# the slow folders first: tests/conftest.py's SLOW_FIRST); TEST_WORKERS=0 runs in one process.
WORKERS=(-n "${TEST_WORKERS:-2}" --dist loadfile)
status=0
echo "== pytest (compiled core: the whole suite)"
# (the floor applies to both runs together: the first alone leaves the compiled modules out)
EXPECT_MQ_SIDECAR_CORE=compiled .venv/bin/python -m pytest "${WORKERS[@]}" --cov \
    --cov-report= --cov-fail-under=0 || status=$?
echo "== pytest (pure-Python core: tests/protocol tests/proxy tests/config tests/fuzz)"
MQ_SIDECAR_PURE=1 EXPECT_MQ_SIDECAR_CORE=pure .venv/bin/python -m pytest "${WORKERS[@]}" --cov \
    --cov-append --cov-report= --cov-fail-under=0 tests/protocol tests/proxy tests/config \
    tests/fuzz || status=$?
echo "== coverage: the daemon (protocol/, proxy/, config/; floor: pyproject.toml's fail_under)"
.venv/bin/coverage report --skip-covered --include='protocol/*,proxy/*,config/*' || status=$?
echo "== coverage: the PySpark data source (spark/; floor: $SPARK_FLOOR %)"
.venv/bin/coverage report --include='spark/*' --fail-under="$SPARK_FLOOR" || status=$?
exit "$status"
