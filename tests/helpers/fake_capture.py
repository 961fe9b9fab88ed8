"""torch.cuda's current device and per-device graph captures, played on a CPU-only torch.

``FakeCapture(monkeypatch, current=0, capturing={1})``: the calling thread's current device is GPU 0 and
torch's current stream on GPU 1 is capturing. It answers ``torch.cuda.is_current_stream_capturing``
for the current device, and ``torch.cuda.device(i)`` / ``current_device()`` move and read it.
"""

from __future__ import annotations

import contextlib

import torch


class FakeCapture:
    def __init__(self, monkeypatch, current: int = 0, capturing=()):
        self.current = current
        self.capturing = set(capturing)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: self.current in self.capturing)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "device", self._device)

    @contextlib.contextmanager
    def _device(self, ordinal):
        old, self.current = self.current, int(ordinal)
        try:
            yield
        finally:
            self.current = old
