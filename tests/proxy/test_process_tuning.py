"""What the daemon's start sets for the whole process (proxy.__main__.run_sidecar)."""

from __future__ import annotations

import gc

from proxy.legs.memory import GC_YOUNG_THRESHOLD, tune_garbage_collector


def test_the_garbage_collector_is_tuned_for_thousands_of_sessions() -> None:
    """The youngest generation is collected every GC_YOUNG_THRESHOLD allocations, not
    CPython's 700 (frames die young instead of being rescanned in full collections), and what
    start-up made is frozen; the older generations keep CPython's thresholds."""
    before = gc.get_threshold()
    try:
        tune_garbage_collector()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
