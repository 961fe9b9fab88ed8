"""GPU suite setup: make ``helpers`` importable without the repository's root conftest, so the
suite runs from a copy of tests/ against an installed skinny_gemm wheel."""

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent.parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
