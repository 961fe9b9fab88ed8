"""Make ``import skinny_gemm`` load this checkout (aot/source_tree.py says why)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_skinny_source_tree", Path(__file__).parent / "aot" / "source_tree.py")
_tree = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tree)
_tree.register()
