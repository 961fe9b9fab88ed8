"""skinny_gemm: AOT-compiled skinny BF16 GEMMs for decode, loaded without a compiler.

This file is installed as ``skinny_gemm/__init__.py`` (CMakeLists.txt) and
registered as such for the source tree (aot/source_tree.py): the fixed
top-level layout has no ``skinny_gemm/`` folder to hold it.
"""

from .runtime.api import counters, linear, manifest, plan_for, planned_ms
from .runtime.version import __version__

__all__ = ["counters", "linear", "manifest", "plan_for", "planned_ms", "__version__"]
