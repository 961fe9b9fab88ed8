"""The served decode step of a model, from the ``step`` key of its file in ``kernels/models/``.

A step is a layer template with repeats, not a written-out list of calls::

    "step": {
      "about": "what the step is and what it assumes (required: a step states its assumptions)",
      "tp": [4, 8],                    # the TP sizes the step is stated for
      "context": 4096,                 # KV-cache tokens per sequence read by every attention op
      "other_weight_bytes": 1,         # bytes per weight of a `linear` that is not one of our BF16 GEMMs
      "layers": {"kda": [OP, ...], "mla": [OP, ...]},
      "sequence": [ITEM, ...]          # ITEM: OP | {"layer": NAME, "repeat": N} | {"repeat": N, "body": [ITEM, ...]}
    }

An OP is ``{"op": KIND, ...fields}``; a field value is an int or, where it depends on
the TP size, ``{"<tp>": int, ...}`` with every TP of the step. Kinds and fields
(all for one rank: sizes in elements per token, kv_bytes_per_token and state_bytes
per sequence, expert_bytes per expert):

  linear        linear: a key of the model's ``linears``; a GEMM of its per-rank (N, K) shape when the
                linear is one of the BF16 GEMMs (seed set or dtype bf16), else a weight read of
                N * K * other_weight_bytes (an FP8 projection's stand-in)
  rms_norm      size                 RMSNorm over M x size
  add_rms_norm  size                 fused residual add + RMSNorm over M x size
  rotary        size                 rotary embedding over M x size (the q and k parts of one rank)
  silu_and_mul  size                 M x 2*size in, M x size out
  attention     kv_bytes_per_token   reads M * context * kv_bytes_per_token (the KV cache of M sequences)
  recurrent     state_bytes          reads M * state_bytes (a recurrent/KDA layer's state per sequence)
  moe           experts, top_k, expert_bytes
                                     reads min(experts, M * top_k) * expert_bytes (each token's experts
                                     distinct from the others': the most bytes M tokens can read)
  all_reduce    size                 a placeholder (no communication): reads M * size bf16; dropped at TP 1

Every op may carry a ``note``. `build` gives the ordered ops of one rank's step
at (TP, M); everything is checked first (`validate`), so a bad file fails with one
line naming the file and the entry, before any GPU work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..runtime import modelfile
from ..runtime.jsonfile import InputError

# kind -> its required fields (besides "op"); "note" is allowed everywhere.
OPS = {
    "linear": ("linear",),
    "rms_norm": ("size",),
    "add_rms_norm": ("size",),
    "rotary": ("size",),
    "silu_and_mul": ("size",),
    "attention": ("kv_bytes_per_token",),
    "recurrent": ("state_bytes",),
    "moe": ("experts", "top_k", "expert_bytes"),
    "all_reduce": ("size",),
}
STEP_KEYS = {"about", "tp", "context", "other_weight_bytes", "layers", "sequence"}
# Nesting and repeat bounds: a step is a few hundred calls, never millions.
MAX_REPEAT = 1024
MAX_DEPTH = 4
BF16_BYTES = 2


class StepError(ValueError):
    """A model file whose step is malformed or names what no GEMM can run; the message is one line."""


@dataclass(frozen=True)
class Op:
    """One call of a built step: a GEMM ("gemm", n, k) or a non-GEMM op with its size and the bytes it reads."""

    kind: str
    name: str
    n: int = 0
    k: int = 0
    size: int = 0
    bytes: int = 0

    @property
    def is_gemm(self) -> bool:
        return self.kind == "gemm"


def load(path: str | Path) -> dict:
    """Read a model file (a path or a catalogue slug) and validate its step; raises StepError (one line) on any
    problem. The step is checked before the linears, so a linear the step cannot run is named by the entry that
    calls it."""
    path = modelfile.path_of(path)
    try:
        model = modelfile.read(path)
    except InputError as exc:
        raise StepError(str(exc)) from None
    validate(model, str(path))
    problems = modelfile.problems(model, complete=False)
    if problems:
        raise StepError(f"{path}: {problems[0]}")
    return model


def has_step(model: dict) -> bool:
    return "step" in model


def validate(model: dict, where: str = "model") -> None:
    """Check the step against the model's linears at every TP it states; raise StepError naming the entry."""
    if "step" not in model:
        raise StepError(f"{where}: no 'step' key (the ordered projections and ops of one decode step)")
    step = model["step"]
    if not isinstance(step, dict):
        raise StepError(f"{where}: step: must be an object")
    unknown = sorted(set(step) - STEP_KEYS)
    if unknown:
        raise StepError(f"{where}: step: unknown key(s) {unknown} (known: {sorted(STEP_KEYS)})")
    if not isinstance(step.get("about"), str) or not step["about"].strip():
        raise StepError(f"{where}: step.about: say what the step is and what it assumes")
    tps = step.get("tp")
    if not isinstance(tps, list) or not tps or not all(_positive(t) for t in tps):
        raise StepError(f"{where}: step.tp: a non-empty list of TP sizes, got {tps!r}")
    for key in ("context", "other_weight_bytes"):
        if key in step and not _positive(step[key]):
            raise StepError(f"{where}: step.{key}: a positive int, got {step[key]!r}")
    layers = step.get("layers", {})
    if not isinstance(layers, dict):
        raise StepError(f"{where}: step.layers: an object of layer name -> list of ops")
    for name, ops in layers.items():
        if not isinstance(ops, list):
            raise StepError(f"{where}: step.layers.{name}: a list of ops")
        for i, op in enumerate(ops):
            _check_op(model, op, f"{where}: step.layers.{name}[{i}]", tps)
    if not isinstance(step.get("sequence"), list) or not step["sequence"]:
        raise StepError(f"{where}: step.sequence: a non-empty list")
    _check_items(model, step["sequence"], f"{where}: step.sequence", tps, layers, 0)
    if "context" not in step and any(op.get("op") == "attention" for ops in layers.values() for op in ops):
        raise StepError(f"{where}: step.context: attention ops read the KV cache of 'context' tokens; state it")


def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _check_items(model, items, where, tps, layers, depth) -> None:
    if depth > MAX_DEPTH:
        raise StepError(f"{where}: nested deeper than {MAX_DEPTH}")
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise StepError(f"{at}: an op, a layer or a repeat block (an object), got {item!r}")
        if "op" in item:
            _check_op(model, item, at, tps)
            continue
        repeat = item.get("repeat", 1)
        if not _positive(repeat) or repeat > MAX_REPEAT:
            raise StepError(f"{at}: repeat must be an int in 1..{MAX_REPEAT}, got {repeat!r}")
        if "layer" in item:
            extra = sorted(set(item) - {"layer", "repeat", "note"})
            if extra or item["layer"] not in layers:
                why = (
                    f"unknown key(s) {extra}" if extra else f"unknown layer {item['layer']!r} (known: {sorted(layers)})"
                )
                raise StepError(f"{at}: {why}")
        elif "body" in item:
            extra = sorted(set(item) - {"body", "repeat", "note"})
            if extra or not isinstance(item["body"], list) or not item["body"]:
                raise StepError(f"{at}: a repeat block is {{'repeat': N, 'body': [items]}}")
            _check_items(model, item["body"], f"{at}.body", tps, layers, depth + 1)
        else:
            raise StepError(f"{at}: needs 'op', 'layer' or 'body'")


def _check_op(model: dict, op, where: str, tps) -> None:
    if not isinstance(op, dict) or "op" not in op:
        raise StepError(f"{where}: an op is {{'op': KIND, ...}}, got {op!r}")
    kind = op["op"]
    if kind not in OPS:
        raise StepError(f"{where}: unknown op {kind!r} (known: {', '.join(sorted(OPS))})")
    fields = OPS[kind]
    missing = [f for f in fields if f not in op]
    extra = sorted(set(op) - {"op", "note", *fields})
    if missing or extra:
        raise StepError(f"{where}: op {kind!r} needs {list(fields)}" + (f", has unknown {extra}" if extra else ""))
    if kind == "linear":
        name = op["linear"]
        linears = model.get("linears")
        lin = linears.get(name) if isinstance(linears, dict) and isinstance(name, str) else None
        if lin is None:
            raise StepError(f"{where}: linear {name!r} is not in the model's linears")
        per_tp = lin.get("tp") if isinstance(lin, dict) else None
        for tp in tps:
            shape = per_tp.get(str(tp)) if isinstance(per_tp, dict) else None
            if not (isinstance(shape, list) and len(shape) == 2 and all(_positive(v) for v in shape)):
                raise StepError(f"{where}: linear {name!r} has no runnable (N, K) at TP {tp} (got {shape!r})")
        return
    for f in fields:
        for tp in tps:
            value = _at_tp(op[f], tp)
            if not _positive(value):
                raise StepError(
                    f"{where}: {kind}.{f} at TP {tp}: a positive int (or a map of TP -> int), got {op[f]!r}"
                )


def _at_tp(value, tp: int):
    return value.get(str(tp)) if isinstance(value, dict) else value


def gemm_linears(model: dict, arch: str | None = None) -> set[str]:
    """The linears that are our BF16 GEMMs: the arch's seed set where the model has one, else dtype bf16."""
    seed = model.get("seed_plan_sets", {}).get(arch) if arch else None
    if seed is not None:
        return set(seed["linears"])
    return modelfile.bf16_linears(model)


def build(model: dict, tp: int, m: int, gemms: set[str] | None = None, arch: str | None = None) -> list[Op]:
    """The ordered ops of one rank's decode step at (tp, m); ``gemms`` the linears run as BF16 GEMMs.

    Raises StepError if the step is not stated for ``tp``; validate the model first (`load` does).
    """
    step = model["step"]
    if tp not in step["tp"]:
        raise StepError(f"{model.get('name', 'model')}: the step is stated for TP {step['tp']}, not {tp}")
    if not _positive(m):
        raise StepError(f"M must be a positive int, got {m!r}")
    gemms = gemm_linears(model, arch) if gemms is None else set(gemms)
    out: list[Op] = []
    _expand(model, step, step["sequence"], "", tp, m, gemms, out)
    return out


def _expand(model, step, items, label, tp, m, gemms, out) -> None:
    for item in items:
        if "op" in item:
            op = _make(model, step, item, label, tp, m, gemms)
            if op is not None:
                out.append(op)
            continue
        for _ in range(item.get("repeat", 1)):
            if "layer" in item:
                _expand(model, step, step["layers"][item["layer"]], item["layer"], tp, m, gemms, out)
            else:
                _expand(model, step, item["body"], label, tp, m, gemms, out)


def _make(model, step, op, label, tp, m, gemms) -> Op | None:
    kind = op["op"]
    where = f"{label}.{kind}" if label else kind
    if kind == "linear":
        name = op["linear"]
        n, k = model["linears"][name]["tp"][str(tp)]
        if name in gemms:
            return Op("gemm", name, n=n, k=k)
        return Op("weight_read", name, n=n, k=k, bytes=n * k * step.get("other_weight_bytes", BF16_BYTES))
    if kind == "all_reduce" and tp == 1:
        return None  # one GPU: no all-reduce
    v = {f: _at_tp(op[f], tp) for f in OPS[kind]}
    if kind == "attention":
        return Op(kind, where, bytes=m * step.get("context", 0) * v["kv_bytes_per_token"])
    if kind == "recurrent":
        return Op(kind, where, bytes=m * v["state_bytes"])
    if kind == "moe":
        return Op(kind, where, bytes=min(v["experts"], m * v["top_k"]) * v["expert_bytes"])
    size = v["size"]
    return Op(kind, where, size=size, bytes=m * size * BF16_BYTES)


def gemm_calls(ops: list[Op]) -> list[tuple[str, int, int]]:
    """The GEMMs of a built step in order: (linear, n, k)."""
    return [(op.name, op.n, op.k) for op in ops if op.is_gemm]


def to_json(ops: list[Op]) -> list:
    """A built step as data (cells.json): ["gemm", n, k] per GEMM, {"op", "size", "bytes"} per other op."""
    return [["gemm", op.n, op.k] if op.is_gemm else {"op": op.kind, "size": op.size, "bytes": op.bytes} for op in ops]


def from_json(data: list) -> list[Op]:
    """Inverse of `to_json` (the names are not kept)."""
    return [
        Op("gemm", "", n=d[1], k=d[2])
        if isinstance(d, list)
        else Op(d["op"], d["op"], size=d["size"], bytes=d["bytes"])
        for d in data
    ]
