"""Loaded (PYTHONPATH) by the processes tests/integration/engine/test_clock_skew.py runs under
libfaketime: there ``time.sleep`` fails with EINVAL (CPython sleeps with
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``, which libfaketime
rewrites wrongly while it leaves the monotonic clock alone). A timed
``Event.wait`` sleeps the same time and works there."""

from __future__ import annotations

import threading
import time

_real_sleep = time.sleep


def _sleep(seconds: float) -> None:
    try:
        _real_sleep(seconds)
    except OSError:
        threading.Event().wait(seconds)


time.sleep = _sleep
