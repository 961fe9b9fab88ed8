"""The model catalogue's check: every file of kernels/models agrees with itself and with vLLM's sharding.

A model file holds the config facts (`arch`) its per-rank shapes (`linears`) derive from; runtime/modelfile.py
reads it and checks the fields it parses. This module adds what only the catalogue promises: every shape a rule
exists for equals the one vLLM builds from `arch` (runtime/sharding.py states the rules), the calls per step
follow the layer counts, the routed experts (apart, not linears: w13 = [2 moe_intermediate / tp, hidden],
w2 = [hidden, moe_intermediate / tp]) and their bytes agree, and `fits` follows `weights_gb`. A wrong number in
either place is one line naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path

from ..runtime import modelfile, sharding
from ..runtime.jsonfile import InputError, where

# GPU memory per name in a model's `fits` (GB), and the share of it the weights may take (catalogue.json's tp_rule).
GPU_GB = {"H100": 80, "H200": 141}
FIT_SHARE = 0.85
# The seed model's own names for linears the rules know.
ALIASES = {"shared_gate_up": "shared_expert_gate_up_proj", "shared_down": "shared_expert_down_proj"}
# Bytes per weight element of the dtypes whose expert bytes are checked (packed 4-bit formats carry scales: not checked).
DTYPE_BYTES = {"bf16": 2, "fp8": 1}


class ModelError(ValueError):
    """A model file that is malformed or inconsistent; the message has one line per problem, each naming file and field."""


def _pos_int(value) -> bool:
    return type(value) is int and value > 0


def catalogue_key_problems(data: dict) -> list[str]:
    """Field types of the keys only the catalogue's check reads (experts, corrections, fits), as 'field: problem'."""
    problems = []
    experts = data.get("experts")
    if experts is not None:
        if not isinstance(experts, dict):
            problems.append("experts: must be an object")
        else:
            for field in ("w13_per_expert", "w2_per_expert"):
                if field in experts:
                    problems += modelfile.shape_problems(f"experts.{field}", experts[field], field)
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
    facts = modelfile.arch(data)
    problems = []
    for name, lin in sorted(data["linears"].items()):
        for tp, listed in sorted(lin["tp"].items()):
            try:
                want = sharding.shape(ALIASES.get(name, name), facts, int(tp))
            except sharding.SplitError as exc:
                problems.append(f"linears.{name}.tp.{tp}: {exc}")
                continue
            if want is not None and list(want) != listed:
                problems.append(f"linears.{name}.tp.{tp}: {listed} but arch gives {list(want)}")
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
        for tp in modelfile.TPS:
            want = sorted(g for g, mem in GPU_GB.items() if size <= FIT_SHARE * tp * mem)
            if sorted(fits.get(str(tp), [])) != want:
                problems.append(f"fits.{tp}: {sorted(fits.get(str(tp), []))} but weights_gb {size} gives {want}")
        listed = {tp for lin in data["linears"].values() for tp in lin["tp"]}
        if listed != set(fits):
            problems.append(f"linears: TPs {sorted(listed)} differ from fits {sorted(fits)}")
    return problems


def _problems(data: dict) -> list[str]:
    """Every problem of one model file's parsed JSON, as 'field: problem' lines."""
    problems = modelfile.problems(data) + catalogue_key_problems(data)
    return problems or consistency_problems(data)


def check_file(path: Path) -> list[str]:
    """Every problem of one model file, one line each, naming the file and the field."""
    path = Path(path)
    try:
        data = modelfile.read(path)
    except InputError as exc:
        return [str(exc)]
    return [f"{path.name}: {p}" for p in _problems(data)]


def load(model: str | Path) -> dict:
    """A model file (a catalogue slug or a path), checked; ModelError lists its problems."""
    path = modelfile.path_of(model)
    if not path.is_file():
        raise ModelError(
            f"{where(path)}: no such model file (catalogue slugs: {', '.join(sorted(modelfile.catalogue()))})"
        )
    try:
        data = modelfile.read(path)
    except InputError as exc:
        raise ModelError(str(exc)) from None
    problems = _problems(data)
    if problems:
        raise ModelError("\n".join(f"{path.name}: {p}" for p in problems))
    return data


def shapes(data: dict, tp: int) -> dict[tuple[int, int], bool]:
    """The distinct (n, k) of a model's skinny-gemm candidates at one TP -> whether any of its layers has a bias."""
    found: dict[tuple[int, int], bool] = {}
    for lin in modelfile.linears(data, tp):
        if lin.skip_reason is None:
            found[(lin.n, lin.k)] = found.get((lin.n, lin.k), False) or lin.bias
    return found


def catalogue_problems() -> list[str]:
    """Every problem of the whole catalogue: each model file, and the index against the files on disk."""
    index = modelfile.catalogue()
    on_disk = set(modelfile.slugs())
    name = modelfile.CATALOGUE_FILE
    problems = [f"{name}: models: {slug!r} has no file" for slug in sorted(set(index) - on_disk)]
    problems += [f"{name}: models: {slug}.json is not indexed" for slug in sorted(on_disk - set(index))]
    for slug in sorted(on_disk):
        problems += check_file(modelfile.path_of(slug))
    return problems
