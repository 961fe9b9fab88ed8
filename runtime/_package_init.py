"""skinny_gemm: AOT-compiled skinny BF16 GEMMs for decode, loaded without a compiler.

This file is installed as ``skinny_gemm/__init__.py`` (CMakeLists.txt) and
registered as such for the source tree (aot/source_tree.py): the fixed
top-level layout has no ``skinny_gemm/`` folder to hold it.

The API (runtime/api.py) needs torch, which takes seconds to import: where
torch is already imported (a model process) it loads at once, so
``torch.ops.skinny_gemm.linear`` exists right after ``import skinny_gemm``;
otherwise (the CLI, ``--help``) at the first use of one of its names.
"""

import sys

from .runtime.version import __version__

_API = ("counters", "linear", "manifest", "plan_for", "planned_ms")
__all__ = [*_API, "__version__"]


def __getattr__(name):
    if name in _API:
        from .runtime import api

        return getattr(api, name)
    raise AttributeError(f"module 'skinny_gemm' has no attribute {name!r}")


if "torch" in sys.modules:
    from .runtime import api  # noqa: F401  (registers the torch op and the CUDA-init hook)
