"""Which Python functions a call enters: sys.setprofile around one call, the profiler in place before restored."""

from __future__ import annotations

import sys
from pathlib import Path


def on_calls(fn, record):
    """``fn()``, with ``record(frame)`` at every Python function call made meanwhile."""

    def watch(frame, event, arg):
        if event == "call":
            record(frame)

    before = sys.getprofile()
    sys.setprofile(watch)
    try:
        return fn()
    finally:
        sys.setprofile(before)


def entered(fn) -> tuple:
    """(``fn()``, [(resolved file, function name) of every Python function it entered, in order])."""
    found = []
    result = on_calls(fn, lambda frame: found.append((Path(frame.f_code.co_filename).resolve(), frame.f_code.co_name)))
    return result, found
