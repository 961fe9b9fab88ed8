"""The one reader of model files (kernels/models/<slug>.json, or a file of that format anywhere): found, read,
checked and parsed into typed records.

A model file lists its per-rank linears (``linears``: per linear, ``"<tp>": [N, K]`` and how it is called) beside
the config facts they derive from (``arch``). This module reads the file through runtime/jsonfile.py (bounded,
one line naming the file on any problem), checks the keys it parses (``problems``: one ``field: problem`` line
each) and gives them as records: ``linears`` (a ``Linear`` per layer at one TP), ``tps`` and ``arch`` (a
runtime/sharding.py ``Arch``). The other keys belong to the modules that read them: ``step`` to aot/steps.py,
``seed_plan_sets`` to aot/plans.py, ``experts`` and ``fits`` to the catalogue's check (aot/models.py).

A catalogue file states every field of each linear (``complete``); a handmade step or shapes file may leave out
those with a default (calls_per_step 0, dtype bf16, no bias, plugin candidate, kind linear or lm_head).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .jsonfile import Fields, InputError, read_json, where
from .sharding import FACTS, Arch

MODELS_DIR = Path(__file__).resolve().parent.parent / "kernels" / "models"
CATALOGUE_FILE = "catalogue.json"
TPS = (1, 2, 4, 8)
KINDS = ("linear", "lm_head", "router")
# `plugin`: whether the vLLM plugin may route a layer (docs/decisions.md), and why not where it may not.
CANDIDATE = "candidate"
ROUTER = "router (not a candidate)"
FAST_PATH = "vllm fast path"
NOT_ROUTED = {
    ROUTER: "router: vLLM's gate, not a candidate",
    FAST_PATH: "vllm fast path: the layer's forward bypasses quant_method.apply",
}
LINEAR_DEFAULTS = {"calls_per_step": 0, "dtype": "bf16", "bias": False, "plugin": CANDIDATE}


@dataclass(frozen=True)
class Linear:
    """One linear layer on one rank: local weight [n, k], called ``calls`` times per decode step."""

    name: str
    kind: str
    n: int
    k: int
    calls: int
    dtype: str = "bf16"
    bias: bool = False
    plugin: str = CANDIDATE

    @property
    def skip_reason(self) -> str | None:
        """Why this layer is no skinny-gemm candidate, or None if it is one."""
        if self.dtype != "bf16":
            return f"dtype {self.dtype}: only bf16 weights are candidates"
        if self.calls == 0:
            return "not called at decode (calls_per_step 0)"
        return NOT_ROUTED.get(self.plugin)


def catalogue_path(slug: str) -> Path:
    """The file of a catalogue model."""
    return MODELS_DIR / f"{slug}.json"


def path_of(model: str | Path) -> Path:
    """A model file: a path (one ending in .json, or one that exists), else the catalogue's file of a slug."""
    path = Path(model)
    if path.suffix == ".json" or path.exists():
        return path
    return catalogue_path(str(model))


def slugs() -> list[str]:
    """The catalogue's models, as files on disk."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json") if p.name != CATALOGUE_FILE)


def catalogue() -> dict[str, str]:
    """slug -> display name of every model in catalogue.json's index."""
    path = MODELS_DIR / CATALOGUE_FILE
    f = Fields(path)
    index = f.obj(f.get(f.obj(read_json(path, "catalogue index"), "the catalogue index"), "models"), "field 'models'")
    return {slug: f.text(name, f"models field {slug!r}") for slug, name in index.items()}


def read(path: str | Path, what: str = "model file") -> dict:
    """The parsed JSON object of ``path``; InputError (one line naming the file) otherwise. Nothing is checked."""
    data = read_json(path, what)
    if type(data) is not dict:
        raise InputError(f"{where(path)}: {what} is not a JSON object")
    return data


def load(model: str | Path) -> dict:
    """A complete model file (a path or a catalogue slug), read and checked; InputError with its first problem
    otherwise."""
    path = path_of(model)
    data = read(path)
    found = problems(data)
    if found:
        raise InputError(f"{where(path)}: {found[0]}")
    return data


def _pos_int(value) -> bool:
    return type(value) is int and value > 0


def shape_problems(place: str, tp_map, field: str = "tp") -> list[str]:
    """Problems of a {"<tp>": [N, K]} map at ``place`` (its key ``field``): a linear's, or per-expert shapes."""
    place = place if field != "tp" else f"{place}.tp"
    if not isinstance(tp_map, dict) or not tp_map:
        return [f'{place}: must be a non-empty object of "<tp>": [N, K]']
    found = []
    for tp, shape in tp_map.items():
        if tp not in {str(t) for t in TPS}:
            found.append(f"{place}: key {tp!r} is not one of {list(TPS)}")
        if not (isinstance(shape, list) and len(shape) == 2 and all(_pos_int(v) for v in shape)):
            found.append(f"{place}.{tp}: {shape!r} must be [N, K], two positive ints")
    return found


def problems(data: dict, complete: bool = True) -> list[str]:
    """The problems of the keys this module parses (name, linears, arch), as 'field: problem' lines."""
    found = []
    if not isinstance(data.get("name"), str) and (complete or "name" in data):
        found.append("name: must be a string")
    linears = data.get("linears")
    if not isinstance(linears, dict) or not linears:
        return found + ["linears: must be a non-empty object"]
    for name, lin in linears.items():
        place = f"linears.{name}"
        if not isinstance(lin, dict):
            found.append(f"{place}: must be an object")
            continue
        if complete or "calls_per_step" in lin:
            calls = lin.get("calls_per_step")
            if type(calls) is not int or calls < 0:
                found.append(f"{place}.calls_per_step: {calls!r} must be an int >= 0")
        for field, typ in (("dtype", str), ("bias", bool), ("plugin", str)):
            if (complete or field in lin) and not isinstance(lin.get(field), typ):
                found.append(f"{place}.{field}: {lin.get(field)!r} must be a {typ.__name__}")
        if (complete or "kind" in lin) and lin.get("kind") not in KINDS:
            found.append(f"{place}.kind: {lin.get('kind')!r} must be one of {list(KINDS)}")
        found += shape_problems(place, lin.get("tp"))
    if complete or "arch" in data:
        facts = data.get("arch")
        if not isinstance(facts, dict) or not all(_pos_int(v) or isinstance(v, bool) for v in facts.values()):
            found.append("arch: must be an object of positive ints and booleans")
        else:
            found += [
                f"arch.{key}: {facts[key]!r} must be a positive int" for key in FACTS if type(facts.get(key)) is bool
            ]
    return found


def tps(data: dict) -> list[int]:
    """The TP sizes a checked model file lists shapes for."""
    return sorted({int(tp) for lin in data["linears"].values() for tp in lin["tp"]})


def linears(data: dict, tp: int) -> list[Linear]:
    """Every linear of a checked model file at one TP (candidates and not), in name order."""
    found = []
    for name, lin in sorted(data["linears"].items()):
        shape = lin["tp"].get(str(tp))
        if shape:
            spec = {**LINEAR_DEFAULTS, "kind": "lm_head" if name == "lm_head" else "linear", **lin}
            found.append(
                Linear(name, spec["kind"], *shape, spec["calls_per_step"], spec["dtype"], spec["bias"], spec["plugin"])
            )
    return found


def bf16_linears(data: dict) -> set[str]:
    """The names of a model's linears whose weights are BF16 (the default dtype)."""
    return {
        name for name, lin in data.get("linears", {}).items() if lin.get("dtype", LINEAR_DEFAULTS["dtype"]) == "bf16"
    }


def arch(data: dict) -> Arch:
    """A checked model file's config facts (``arch``) as the sharding rules read them."""
    facts = {key: value for key, value in (data.get("arch") or {}).items() if key in FACTS and type(value) is int}
    if "experts" in facts:
        # A MoE file's `intermediate` is its experts' width (gpt-oss's intermediate_size), not a dense MLP's.
        facts.pop("intermediate", None)
    return Arch(**facts)
