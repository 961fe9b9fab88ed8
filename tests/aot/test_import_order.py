"""The modules of aot/ import one another in one direction: no import cycle, at module level or inside a function."""

import ast
from pathlib import Path

AOT = Path(__file__).resolve().parents[2] / "aot"


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
