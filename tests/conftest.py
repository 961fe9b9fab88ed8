"""Make ``helpers`` importable in every suite, also without the repository's root conftest: the GPU
suite runs from a copy of tests/ against an installed skinny_gemm wheel."""

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
