"""The modules of aot/ import one another in one direction: no import cycle, at module level or inside a function.
The runtime imports neither aot/ nor cutlass, and of kernels/ only config.py (docs/decisions.md says why)."""

import ast
from pathlib import Path

AOT = Path(__file__).resolve().parents[2] / "aot"
RUNTIME = AOT.parent / "runtime"


def sibling_imports(path: Path, names: set[str]) -> set[str]:
    """The aot/ modules one file imports (``from .x import ...`` and ``from . import x``), wherever the import is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return (found & names) - {path.stem}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_aot_modules_form_no_import_cycle():
    names = {p.stem for p in AOT.glob("*.py")}
    edges = {p.stem: sibling_imports(p, names) for p in AOT.glob("*.py")}
    assert edges["tune"] and edges["prepare"], "the walk must see the tuner's imports"
    assert cycles(edges) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def package_imports(path: Path) -> set[str]:
    """What one runtime/ file imports from outside runtime/, wherever the import is: dotted names under the
    package (``kernels.config.KernelConfig``, ``aot.build``) or absolute ones (``torch``, ``cutlass.cute``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level in (0, 2):
            found.update(f"{node.module}.{a.name}" if node.module else a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def forbidden(path: Path) -> list[str]:
    """What one runtime/ file imports that the runtime may not: aot/, cutlass, kernels/ other than config.py."""
    bad = []
    for name in package_imports(path):
        root = name.split(".")[0]
        if name.startswith("skinny_gemm."):
            name, root = name.removeprefix("skinny_gemm."), name.split(".")[1]
        config = name == "kernels.config" or name.startswith("kernels.config.")
        if root in ("aot", "cutlass") or (root == "kernels" and not config):
            bad.append(name)
    return sorted(bad)


def test_runtime_imports_no_aot_no_cutlass_and_only_the_kernels_config():
    """What runtime/ may import: the serving process and the wheel's coverage run without cutlass or aot/."""
    files = sorted(RUNTIME.glob("*.py"))
    bad = {path.name: forbidden(path) for path in files if forbidden(path)}
    assert len(files) > 10 and bad == {}, bad


def test_the_runtime_check_finds_each_forbidden_import(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text(
        "from ..kernels.config import KernelConfig\nfrom ..kernels import config\nfrom . import elf\nimport torch\n"
        "def f():\n    from ..aot import build\n    from ..kernels.skinny_mma import x\n    import cutlass.cute\n"
        "    from skinny_gemm.aot.models import load\n"
    )
    assert forbidden(path) == ["aot.build", "aot.models.load", "cutlass.cute", "kernels.skinny_mma.x"]
