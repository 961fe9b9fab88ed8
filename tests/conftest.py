"""Make ``helpers`` importable in every suite, also without the repository's root conftest (the GPU
suite runs from a copy of tests/ against an installed skinny_gemm wheel), and share the artifact
fixtures (helpers/artifacts.py: one build per session, damaged copies, a loader on a FakeDriver)."""

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from helpers.artifacts import art, build_copy, built, fresh, tree_copy  # noqa: E402, F401  (fixtures)
