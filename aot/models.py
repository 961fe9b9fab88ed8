"""The model catalogue (kernels/models/*.json): load and validate a model file, list its BF16 GEMM cells per TP.

A model file holds the config facts (`arch`) its per-rank shapes (`linears`) derive from. The
check re-derives every shape it knows a rule for, the way vLLM shards it, so a wrong number
in either place is one line naming the file and the field. The rules:
  qkv_proj N = (heads / tp + 2 max(1, kv_heads / tp)) x head_dim  (KV heads replicated past kv_heads)
  o_proj K = heads x head_dim / tp (MLA: heads x v_head / tp), N = hidden
  gate_up N = 2 x intermediate / tp, down K = intermediate / tp (dense_*: dense_intermediate,
  shared_expert_*: shared_experts x moe_intermediate)
  lm_head N = pad64(vocab) / tp, K = hidden; router N = experts, replicated
  MLA: fused_qkv_a N = q_lora + kv_lora + qk_rope (replicated), q_b N = heads (qk_nope + qk_rope) / tp,
  kv_b N = heads (qk_nope + v_head) / tp
  routed experts (apart, not linears): w13 = [2 moe_intermediate / tp, hidden], w2 = [hidden, moe_intermediate / tp]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..runtime.jsonfile import InputError, read_json

MODELS_DIR = Path(__file__).resolve().parent.parent / "kernels" / "models"
CATALOGUE_FILE = "catalogue.json"
TPS = (1, 2, 4, 8)
KINDS = ("linear", "lm_head", "router")
# GPU memory per name in a model's `fits` (GB), and the share of it the weights may take (catalogue.json's tp_rule).
GPU_GB = {"H100": 80, "H200": 141}
FIT_SHARE = 0.85
# vLLM pads the vocabulary to a multiple of 64 before splitting the LM head across ranks.
VOCAB_PAD = 64
# `plugin` values of layers the vLLM plugin cannot route whatever plans exist.
NOT_ROUTED = {
    "router (not a candidate)": "router: vLLM's gate, not a candidate",
    "vllm fast path": "vllm fast path: the layer's forward bypasses quant_method.apply",
}


# The seed model's own names for linears the rules know.
ALIASES = {"shared_gate_up": "shared_expert_gate_up_proj", "shared_down": "shared_expert_down_proj"}
# Bytes per weight element of the dtypes whose expert bytes are checked (packed 4-bit formats carry scales: not checked).
DTYPE_BYTES = {"bf16": 2, "fp8": 1}


class ModelError(ValueError):
    """A model file that is malformed or inconsistent; the message has one line per problem, each naming file and field."""


@dataclass(frozen=True)
class Linear:
    """One BF16-or-not linear of a model at one TP: its per-rank weight [n, k] and how it is used."""

    name: str
    n: int
    k: int
    calls: int
    dtype: str
    bias: bool
    plugin: str

    @property
    def skip_reason(self) -> str | None:
        """Why this layer is no skinny-gemm candidate, or None if it is one."""
        if self.dtype != "bf16":
            return f"dtype {self.dtype}: only bf16 weights are candidates"
        if self.calls == 0:
            return "not called at decode (calls_per_step 0)"
        return NOT_ROUTED.get(self.plugin)


def model_path(slug: str) -> Path:
    """The file of a catalogue slug."""
    return MODELS_DIR / f"{slug}.json"


def catalogue() -> dict[str, str]:
    """slug -> display name of every model in catalogue.json's index."""
    return json.loads((MODELS_DIR / CATALOGUE_FILE).read_text())["models"]


def _pos_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _shape_problems(where: str, tp_map, field: str = "tp") -> list[str]:
    """Problems of a {"<tp>": [N, K]} map at ``where`` (its key ``field``)."""
    where = where if field != "tp" else f"{where}.tp"
    if not isinstance(tp_map, dict) or not tp_map:
        return [f'{where}: must be a non-empty object of "<tp>": [N, K]']
    problems = []
    for tp, shape in tp_map.items():
        if tp not in {str(t) for t in TPS}:
            problems.append(f"{where}: key {tp!r} is not one of {list(TPS)}")
        if not (isinstance(shape, list) and len(shape) == 2 and all(_pos_int(v) for v in shape)):
            problems.append(f"{where}.{tp}: {shape!r} must be [N, K], two positive ints")
    return problems


def structure_problems(data) -> list[str]:
    """Field types of one model file (the part every other check relies on), as 'field: problem' lines."""
    if not isinstance(data, dict):
        return ["top level: must be a JSON object"]
    problems = []
    if not isinstance(data.get("name"), str):
        problems.append("name: must be a string")
    linears = data.get("linears")
    if not isinstance(linears, dict) or not linears:
        return problems + ["linears: must be a non-empty object"]
    for name, lin in linears.items():
        where = f"linears.{name}"
        if not isinstance(lin, dict):
            problems.append(f"{where}: must be an object")
            continue
        calls = lin.get("calls_per_step")
        if not isinstance(calls, int) or isinstance(calls, bool) or calls < 0:
            problems.append(f"{where}.calls_per_step: {calls!r} must be an int >= 0")
        for field, typ in (("dtype", str), ("bias", bool), ("plugin", str)):
            if not isinstance(lin.get(field), typ):
                problems.append(f"{where}.{field}: {lin.get(field)!r} must be a {typ.__name__}")
        if lin.get("kind") not in KINDS:
            problems.append(f"{where}.kind: {lin.get('kind')!r} must be one of {list(KINDS)}")
        problems += _shape_problems(where, lin.get("tp"))
    arch = data.get("arch")
    if not isinstance(arch, dict) or not all(_pos_int(v) or isinstance(v, bool) for v in arch.values()):
        problems.append("arch: must be an object of positive ints and booleans")
    experts = data.get("experts")
    if experts is not None:
        if not isinstance(experts, dict):
            problems.append("experts: must be an object")
        else:
            for field in ("w13_per_expert", "w2_per_expert"):
                if field in experts:
                    problems += _shape_problems(f"experts.{field}", experts[field], field)
            for field in ("num_experts", "top_k", "layers"):
                if field in experts and not _pos_int(experts[field]):
                    problems.append(f"experts.{field}: {experts[field]!r} must be a positive int")
            if not isinstance(experts.get("dtype", ""), str):
                problems.append(f"experts.dtype: {experts['dtype']!r} must be a string")
            per_step = experts.get("bytes_per_step_M1", {})
            if not isinstance(per_step, dict) or not all(_pos_int(v) for v in per_step.values()):
                problems.append('experts.bytes_per_step_M1: must map "<tp>" to a positive int')
    corrections = data.get("corrections", [])
    if not isinstance(corrections, list) or not all(
        isinstance(c, dict) and isinstance(c.get("field"), str) and isinstance(c.get("why"), str) for c in corrections
    ):
        problems.append("corrections: must be a list of {field, was, now, why} with field and why strings")
    fits = data.get("fits")
    if fits is not None and not (
        isinstance(fits, dict) and all(isinstance(v, list) and set(v) <= set(GPU_GB) for v in fits.values())
    ):
        problems.append(f'fits: must map "<tp>" to a list of {sorted(GPU_GB)}')
    return problems


def _expected(name: str, arch: dict, tp: int) -> tuple[int, int] | None:
    """The [N, K] the arch implies for a linear of this name at ``tp``, or None where no rule applies."""
    name = ALIASES.get(name, name)
    a = arch.get
    hidden = a("hidden")
    mla = "kv_lora_rank" in arch
    if name == "lm_head" and a("vocab"):
        return -(-a("vocab") // VOCAB_PAD) * VOCAB_PAD // tp, hidden
    if name == "router" and a("experts"):
        return a("experts"), hidden
    if name == "qkv_proj" and a("head_dim") and not mla:
        heads, kv = a("heads") // tp, max(1, a("kv_heads") // tp)
        return (heads + 2 * kv) * a("head_dim"), hidden
    if name == "o_proj":
        per_head = a("v_head") if mla else a("head_dim")
        return (hidden, a("heads") * per_head // tp) if per_head else None
    if mla and name == "fused_qkv_a_proj":
        return a("q_lora_rank") + a("kv_lora_rank") + a("qk_rope"), hidden
    if mla and name == "q_b_proj":
        return a("heads") * (a("qk_nope") + a("qk_rope")) // tp, a("q_lora_rank")
    if mla and name == "kv_b_proj":
        return a("heads") * (a("qk_nope") + a("v_head")) // tp, a("kv_lora_rank")
    width = {
        "": a("intermediate") if "experts" not in arch else None,
        "dense_": a("dense_intermediate"),
        "shared_expert_": (a("shared_experts") or 0) * (a("moe_intermediate") or 0) or None,
    }
    for prefix, inter in width.items():
        if inter and name == f"{prefix}gate_up_proj":
            return 2 * inter // tp, hidden
        if inter and name == f"{prefix}down_proj":
            return hidden, inter // tp
    return None


def _expected_calls(name: str, arch: dict) -> int | None:
    """Calls per decode step the arch implies (one per layer of the layers that hold it), or None if unknown."""
    layers, dense = arch.get("layers"), arch.get("dense_layers", 0)
    if not layers:
        return None
    if name == "lm_head":
        return 1
    if name.startswith("dense_"):
        return dense
    if name.startswith("shared_expert_") or name == "router":
        return layers - dense
    if name in ("qkv_proj", "o_proj", "fused_qkv_a_proj", "q_b_proj", "gate_up_proj", "down_proj"):
        return layers
    return None


def consistency_problems(data: dict) -> list[str]:
    """Where a model's shapes, calls, TPs or experts disagree with its `arch` (structure already checked)."""
    arch = data.get("arch") or {}
    problems = []
    for name, lin in sorted(data["linears"].items()):
        for tp, shape in sorted(lin["tp"].items()):
            try:
                want = _expected(name, arch, int(tp))
            except TypeError:  # a fact the rule needs is not in arch: nothing to check it against
                want = None
            if want is not None and list(want) != shape:
                problems.append(f"linears.{name}.tp.{tp}: {shape} but arch gives {list(want)}")
        calls = _expected_calls(name, arch)
        if calls is not None and lin["calls_per_step"] not in (calls, 0):
            problems.append(f"linears.{name}.calls_per_step: {lin['calls_per_step']} but arch gives {calls}")
    experts = data.get("experts")
    if isinstance(experts, dict) and arch.get("experts") and arch.get("hidden") and arch.get("layers"):
        inter = arch.get("moe_intermediate") or arch.get("intermediate") or 0
        for tp, shape in sorted(experts.get("w13_per_expert", {}).items()):
            if shape != [2 * inter // int(tp), arch["hidden"]]:
                problems.append(
                    f"experts.w13_per_expert.{tp}: {shape} but arch gives {[2 * inter // int(tp), arch['hidden']]}"
                )
        for tp, shape in sorted(experts.get("w2_per_expert", {}).items()):
            if shape != [arch["hidden"], inter // int(tp)]:
                problems.append(
                    f"experts.w2_per_expert.{tp}: {shape} but arch gives {[arch['hidden'], inter // int(tp)]}"
                )
        per_elem = DTYPE_BYTES.get(experts.get("dtype"))
        for tp, got in sorted(experts.get("bytes_per_step_M1", {}).items()):
            w13, w2 = experts.get("w13_per_expert", {}).get(tp), experts.get("w2_per_expert", {}).get(tp)
            if per_elem and w13 and w2 and experts.get("layers") and experts.get("top_k"):
                want = experts["layers"] * experts["top_k"] * (w13[0] * w13[1] + w2[0] * w2[1]) * per_elem
                if got != want:
                    problems.append(
                        f"experts.bytes_per_step_M1.{tp}: {got} but layers x top_k x expert bytes give {want}"
                    )
        for field, want in (
            ("num_experts", arch["experts"]),
            ("top_k", arch.get("top_k")),
            ("layers", arch["layers"] - arch.get("dense_layers", 0)),
        ):
            if experts.get(field) != want:
                problems.append(f"experts.{field}: {experts.get(field)!r} but arch gives {want}")
    fits, size = data.get("fits"), data.get("weights_gb")
    if isinstance(fits, dict) and isinstance(size, (int, float)):
        for tp in TPS:
            want = sorted(g for g, mem in GPU_GB.items() if size <= FIT_SHARE * tp * mem)
            if sorted(fits.get(str(tp), [])) != want:
                problems.append(f"fits.{tp}: {sorted(fits.get(str(tp), []))} but weights_gb {size} gives {want}")
        listed = {tp for lin in data["linears"].values() for tp in lin["tp"]}
        if listed != set(fits):
            problems.append(f"linears: TPs {sorted(listed)} differ from fits {sorted(fits)}")
    return problems


def check_file(path: Path) -> list[str]:
    """Every problem of one model file, one line each, naming the file and the field."""
    path = Path(path)
    try:
        data = read_json(path, "model file")
    except InputError as exc:
        return [str(exc)]
    problems = structure_problems(data)
    if not problems:
        problems = consistency_problems(data)
    return [f"{path.name}: {p}" for p in problems]


def load(model: str | Path) -> dict:
    """A model file (a catalogue slug or a path), checked; ModelError lists its problems."""
    path = Path(model) if str(model).endswith(".json") else model_path(str(model))
    if not path.is_file():
        raise ModelError(f"{path}: no such model file (catalogue slugs: {', '.join(sorted(catalogue()))})")
    problems = check_file(path)
    if problems:
        raise ModelError("\n".join(problems))
    try:
        return read_json(path, "model file")
    except InputError as exc:  # replaced since it was checked
        raise ModelError(str(exc)) from None


def tps(data: dict) -> list[int]:
    """The TP sizes a model lists shapes for."""
    return sorted({int(tp) for lin in data["linears"].values() for tp in lin["tp"]})


def linears(data: dict, tp: int) -> list[Linear]:
    """Every linear of a model at one TP (candidates and not), in name order."""
    found = []
    for name, lin in sorted(data["linears"].items()):
        shape = lin["tp"].get(str(tp))
        if shape:
            found.append(
                Linear(name, shape[0], shape[1], lin["calls_per_step"], lin["dtype"], lin["bias"], lin["plugin"])
            )
    return found


def shapes(data: dict, tp: int) -> dict[tuple[int, int], bool]:
    """The distinct (n, k) of a model's skinny-gemm candidates at one TP -> whether any of its layers has a bias."""
    found: dict[tuple[int, int], bool] = {}
    for lin in linears(data, tp):
        if lin.skip_reason is None:
            found[(lin.n, lin.k)] = found.get((lin.n, lin.k), False) or lin.bias
    return found


def catalogue_problems() -> list[str]:
    """Every problem of the whole catalogue: each model file, and the index against the files on disk."""
    index = catalogue()
    on_disk = {p.stem for p in MODELS_DIR.glob("*.json") if p.name != CATALOGUE_FILE}
    problems = [f"{CATALOGUE_FILE}: models: {slug!r} has no file" for slug in sorted(set(index) - on_disk)]
    problems += [f"{CATALOGUE_FILE}: models: {slug}.json is not indexed" for slug in sorted(on_disk - set(index))]
    for slug in sorted(on_disk):
        problems += check_file(model_path(slug))
    return problems
