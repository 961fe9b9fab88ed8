"""Make ``helpers`` importable in every suite, also without the repository's root conftest (the GPU
suite runs from a copy of tests/ against an installed skinny_gemm wheel), share the artifact
fixtures (helpers/artifacts.py: one build per session, damaged copies, a loader on a FakeDriver),
and give vLLM engine runs a fresh cache folder each whose model-class facts are shared."""

import os
import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from helpers.artifacts import art, build_copy, built, fresh, tree_copy  # noqa: E402, F401  (fixtures)


@pytest.fixture(scope="session")
def vllm_cache_root(tmp_path_factory):
    """make(folder) -> ``folder`` as a fresh VLLM_CACHE_ROOT for one engine run (nothing compiled by another run is
    there) whose ``modelinfos/`` is one folder for the whole session, every pytest-xdist worker included.

    vLLM learns a model class's facts (_ModelInfo: multimodal, pooling, ...) by importing the class in a subprocess
    (vllm/model_executor/models/registry.py), 15-20 s on 2 cores, unless ``modelinfos/`` holds them for that
    class's source file (keyed by its hash, written atomically). They depend on vLLM's source only.
    """
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "vllm-modelinfos"
    shared.mkdir(exist_ok=True)

    def make(folder: Path) -> Path:
        folder.mkdir(parents=True)
        (folder / "modelinfos").symlink_to(shared, target_is_directory=True)
        return folder

    return make


# pytest-xdist (.ci/run: `-n 2 --dist loadgroup`): each expensive fixture that a module or the session shares is made
# on one worker only, by putting the tests that use it in one group (the vLLM engine tests mark their own groups, one
# per TP size: tests/runtime/test_vllm_plugin.py).
SHARED_FIXTURE_GROUPS = {
    "built": "artifacts-build",  # helpers/artifacts.py: the session's clean build of both archs
    "catalogue_cache": "catalogue-build",  # test_catalogue_build.py: one catalogue compile, reused by the load test
    "vllm_built": "coverage-meta-build",  # test_coverage.py: every public config built by vLLM on the meta device
    "new_paths_built": "ops-new-paths",  # test_ops.py: the test-only variants' build
    "held_out": "costmodel-held-out",  # test_costmodel.py: 13 leave-one-shape-out fits
    "wheels": "wheels",  # test_wheel.py: $SKINNY_WHEELS's wheels, or both built there
}
# The groups and tests that take longest start first, so that neither worker is left with a long one at the end
# (ordered by the durations CI prints; a hint for the order, never a limit).
LONGEST_FIRST = (
    "vllm-engines-tp2",
    "vllm-engines-tp1",
    "artifacts-build",
    "catalogue-build",
    "wheels",
    "tests/aot/test_vllm_bench.py::test_section_end_to_end_on_vllm_cpu",
    "coverage-meta-build",
)


def _group(item) -> str | None:
    marks = [mark.args[0] for mark in item.iter_markers("xdist_group")]
    return marks[0] if marks else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _group(item) is None:
            shared = [group for name, group in SHARED_FIXTURE_GROUPS.items() if name in item.fixturenames]
            if shared:
                item.add_marker(pytest.mark.xdist_group(shared[0]))
    if os.environ.get("PYTEST_XDIST_WORKER"):

        def rank(item) -> int:
            keys = (_group(item), item.nodeid.split("[")[0])
            return min((LONGEST_FIRST.index(k) for k in keys if k in LONGEST_FIRST), default=len(LONGEST_FIRST))

        items.sort(key=rank)  # stable: within a group and among the rest, the order stays as collected


@pytest.hookimpl(trylast=True)  # after pytest-xdist has named each test's group in its id
def pytest_collection_finish(session):
    if not (os.environ.get("PYTEST_XDIST_WORKER") and session.config.getvalue("loadgroup")):
        return
    lost = [item.nodeid for item in session.items if _group(item) and not item.nodeid.endswith(f"@{_group(item)}")]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup did not group {len(lost)} tests (e.g. {lost[0]}): each would start its group's "
            "engines or build again; this pytest-xdist does not group on this pytest (tests/requirements.txt pins both)"
        )
