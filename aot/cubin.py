"""Read what a cubin says about itself: the runtime's one ELF reader (runtime/elf.py), for build and verify.

The reader lives in runtime/ because the runtime checks every cubin before the
driver sees it and may not import aot/; build and verify use the same code.
"""

from __future__ import annotations

from ..runtime.elf import CubinError, CubinInfo, KernelInfo, inspect

__all__ = ["CubinError", "CubinInfo", "KernelInfo", "inspect"]
