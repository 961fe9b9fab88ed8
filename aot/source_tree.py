"""Import the source tree as the ``skinny_gemm`` package, exactly as the wheel lays it out.

The wheel maps ``runtime/``, ``aot/``, ``kernels/`` and ``artifacts/`` under
``skinny_gemm/`` (CMakeLists.txt). This module gives the checkout the same
import names without installing: the tests' conftest loads it by path, and
CMake runs it as a script (``python aot/source_tree.py build ...``) so the
build step imports the same code the wheel will hold.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def register(root: Path = ROOT, run_init: bool = True):
    """Make ``import skinny_gemm`` load the tree at ``root``; return the package module.

    ``run_init=False`` skips the package's ``__init__`` (the public API, which
    imports torch): the build step runs in an environment without torch.
    """
    if "skinny_gemm" in sys.modules:
        return sys.modules["skinny_gemm"]
    spec = importlib.util.spec_from_file_location(
        "skinny_gemm", root / "runtime" / "_package_init.py", submodule_search_locations=[str(root)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["skinny_gemm"] = module
    if run_init:
        spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    register(run_init=False)
    from skinny_gemm.aot.cli import main

    raise SystemExit(main())
