"""Hang protection without a wall-clock limit: a case that blocks (a FIFO opened for reading) fails after
a minute, while any time a busy shared machine needs below that passes. A test must never assert how fast
something ran: that measures the machine, not the code."""

from __future__ import annotations

import contextlib
import signal

HANG_SECONDS = 60


class Hung(AssertionError):
    """The guarded block ran past HANG_SECONDS: it blocks (the defect the guard exists for)."""


@contextlib.contextmanager
def no_hang(what: str, seconds: int = HANG_SECONDS):
    """Fail with ``Hung`` when the block has not returned after ``seconds`` (SIGALRM interrupts a blocking
    open or read in the main thread; pytest runs tests there)."""

    def alarm(signum, frame):
        raise Hung(f"{what} blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
