"""A cost model of candidate configs, fitted on the committed H200 timings: rank candidates, time only the best few.

Tuning the catalogue at M = 1, 2, 4, 8, 16 with every candidate would ask ~170k timings
(the spaces of kernels/candidates.json over the catalogue's cells); the H200 measures about
27 per second (README: 2902-3307 timings in about 2 minutes per run). So `tune prepare --top N`
keeps each cell's N best predicted candidates plus the best few of each kernel family (the
model has seen no M above 4 and 13 shapes: a family it misjudges still gets timed).

The model: log(us) as a ridge regression (numpy only) on physical features of the config at
the shape: weight bytes, CTAs and waves over the SMs, the last wave's idle share, bytes in
flight per SM, K-loop trips, bytes per CTA, threads, tokens, and the kernel kind and its
options. The fit weights each timing by exp(-(log us - log best us of its cell) / TAU), so
the fast end of each cell, where the pick is made, counts most.
Held-out quality (`skinny-gemm tune model-check`) is measured by shape: every cell of one
(N, K) is predicted by a model fitted without that shape.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..kernels.config import H200_SMS, KernelConfig
from ..runtime.manifest import dumps
from .candidates import resident_ctas

TUNING_DIR = Path(__file__).resolve().parent.parent / "kernels" / "plans" / "tuning" / "sm_90a"
MODEL_FILE = TUNING_DIR / "costmodel.json"
SMS = H200_SMS
# Ridge strength on standardized features, and the weight decay of a timing by its distance from its cell's best
# (in log us): of TAU 0.15, 0.3, 0.5 and none, and ridge 1e-3..1, these held out best (model-check).
RIDGE, TAU = 1e-2, 0.5
# A read rate that makes bytes_us a time (near the H200's 4.59 TB/s steady rate: docs/perf.md, "Per-cell figures").
BYTES_PER_US = 4.6e6
TOPS = (1, 5, 10, 16, 20)
# The default cut of `tune prepare --top`: the model's best 16 and the best 2 of every family.
TOP, PER_FAMILY = 16, 2


def family(cfg: KernelConfig) -> str:
    """A config's kernel family: its kind and the option that changes how it walks the weight."""
    if cfg.kind == "mma":
        if cfg.ring:
            return "mma+ring"
        if cfg.walk:
            return "mma+walk"
        return "mma+split" if cfg.split > 1 else "mma+sliced" if cfg.slices > 1 else "mma"
    if cfg.kind == "wgmma":
        return "wgmma+walk" if cfg.persist else "wgmma"
    return "simt+persist" if cfg.persist else cfg.kind


def features(cfg: KernelConfig, n: int, k: int) -> dict[str, float]:
    """The model's features of one config at one shape (names are the coefficient keys)."""
    weight = 2 * n * k
    ctas = cfg.grid(n)
    resident = max(1, resident_ctas(cfg))
    waves = ctas / (SMS * resident)
    full = math.ceil(waves)
    if cfg.kind == "simt":
        flight_cta = cfg.threads * cfg.unroll * cfg.cols * cfg.vec * 2
    elif cfg.kind == "wgmma":
        flight_cta = cfg.stages * cfg.cols * 128  # the ring's weight boxes
    else:
        # 512 bytes per warp, tile and buffered step
        flight_cta = cfg.threads // 32 * cfg.stages * cfg.unroll * max(1, cfg.mma_tiles) * 512
    flight = flight_cta * min(resident, ctas / SMS)
    # the tensor-core kinds share the token terms; "wgmma" has its own offset and ring depth
    mma, wg, log_m = cfg.kind in ("mma", "wgmma"), cfg.kind == "wgmma", math.log(cfg.m)
    return {
        "one": 1.0,
        "log_bytes": math.log(weight),
        "bytes_us": weight / BYTES_PER_US,
        "log_m": log_m,
        "log_ctas": math.log(ctas),
        "log_waves": math.log(waves),
        "last_wave_idle": (full - waves) / full,
        "inv_waves": 1 / full,
        "log_flight": math.log(flight),
        "log_flight_sq": math.log(flight) ** 2,
        "log_bytes_per_cta": math.log(weight / ctas),
        "log_trips": math.log(k / cfg.k_step),
        "log_threads": math.log(cfg.threads),
        "mma": float(mma),
        "split": float(cfg.split > 1),
        "sliced": float(cfg.slices > 1),
        "persist": float(cfg.persist > 0 and cfg.kind == "simt"),
        "prefetch": float(cfg.prefetch),
        "early": float(cfg.early),
        "fetch0": float(cfg.kind == "mma" and cfg.fetch == 0),
        "fetch128": float(cfg.kind == "mma" and cfg.fetch == 128),
        "mma_log_m": mma * log_m,
        "simt_log_m": (not mma) * log_m,
        "simt_m_cols": (not mma) * cfg.m * cfg.cols / 8,
        "mma_log_bytes": mma * math.log(weight),
        "log_split": math.log(cfg.split),
        "log_slices": math.log(cfg.slices),
        "log_stages": math.log(cfg.stages),
        "log_unroll": math.log(cfg.unroll),
        "log_bytes_x_log_flight": math.log(weight) * math.log(flight),
        "log_bytes_x_log_waves": math.log(weight) * math.log(waves),
        "log_bytes_x_idle": math.log(weight) * (full - waves) / full,
        "simt_log_flight": (not mma) * math.log(flight),
        "simt_log_waves": (not mma) * math.log(waves),
        "early_log_bytes": cfg.early * math.log(weight),
        "early_log_waves": cfg.early * math.log(waves),
        "prefetch_log_bytes": cfg.prefetch * math.log(weight),
        "simt_log_trips": (not mma) * math.log(k / cfg.k_step),
        "wgmma": float(wg),
        "wgmma_log_stages": wg * math.log(cfg.stages),
        "wgmma_log_split": wg * math.log(cfg.split),
        # the mma ring: its own offset and depth, and the token slots it copies per weight slot (the
        # shared-memory traffic that made 8 rows per warp lose)
        "ring": float(cfg.ring),
        "ring_log_stages": cfg.ring * math.log(cfg.stages),
        "ring_token_ratio": cfg.ring * cfg.token_loads / max(1, cfg.mma_tiles),
    }


FEATURES = tuple(features(KernelConfig(m=1), 1024, 4096))


@dataclass
class Timings:
    """Every correct, timed candidate of some tuner results files, as arrays."""

    x: object  # (rows, features) float64
    log_us: object
    shape: list  # (n, k) per row
    cell: list  # (file, n, k, m) per row
    family: list  # family(cfg) per row
    files: list  # (name, sha256) per file


def load_timings(paths) -> Timings:
    """The timings of tuner results files (`tune measure` output): candidates with no bad elements and a time."""
    import numpy as np

    rows, logs, shapes, cells, fams, files = [], [], [], [], [], []
    for path in sorted(Path(p) for p in paths):
        blob = path.read_bytes()
        files.append((path.name, hashlib.sha256(blob).hexdigest()))
        for row in json.loads(blob)["cells"]:
            n, k, m = row["n"], row["k"], row["m"]
            for cand in row["candidates"].values():
                if cand["bad_elements"] == 0 and cand.get("us"):
                    cfg = KernelConfig.from_json(cand["config"])
                    rows.append(list(features(cfg, n, k).values()))
                    fams.append(family(cfg))
                    logs.append(math.log(cand["us"]))
                    shapes.append((n, k))
                    cells.append((path.name, n, k, m))
    return Timings(np.array(rows), np.array(logs), shapes, cells, fams, files)


def committed_timings() -> list[Path]:
    """The committed H200 tuner results (every file of the tuning folder but the model itself)."""
    return sorted(p for p in TUNING_DIR.glob("tune-*.json"))


def _fit_arrays(x, log_us, cells, ridge=RIDGE, tau=TAU):
    """Ridge regression of log us on standardized features, near-best timings weighted up; raw-space (coef, intercept)."""
    import numpy as np

    best: dict = {}
    for c, v in zip(cells, log_us):
        best[c] = min(best.get(c, v), v)
    weight = np.exp(-(log_us - np.array([best[c] for c in cells])) / tau)
    mean, scale = x.mean(0), x.std(0)
    mean[0], scale[0] = 0.0, 1.0
    scale[scale == 0] = 1.0
    z = (x - mean) / scale
    zw = z * weight[:, None]
    a = z.T @ zw + ridge * np.diag([0.0] + [1.0] * (z.shape[1] - 1))
    w = np.linalg.solve(a, zw.T @ log_us)
    coef = w / scale
    coef[0] -= float(mean @ coef)
    return coef


def fit(paths=None) -> dict:
    """Fit on tuner results files (default: the committed ones); the model as JSON-ready data."""
    paths = list(paths) if paths else committed_timings()
    t = load_timings(paths)
    coef = _fit_arrays(t.x, t.log_us, t.cell)
    return {
        "about": "log(us) = sum(coef[f] * feature f) of aot/costmodel.py features(cfg, n, k); refit with "
        "`skinny-gemm tune model-fit`, check with `skinny-gemm tune model-check`",
        "coef": {name: round(float(c), 12) for name, c in zip(FEATURES, coef)},
        "fit": {
            "ridge": RIDGE,
            "tau": TAU,
            "rows": len(t.log_us),
            "cells": len(set(t.cell)),
            "families": {fam: t.family.count(fam) for fam in sorted(set(t.family))},
            "files": {name: sha for name, sha in t.files},
        },
    }


def write(model: dict, out: Path = MODEL_FILE) -> Path:
    """Write the model JSON (sorted, stable)."""
    Path(out).write_text(dumps(model))
    return Path(out)


def load(path: Path = MODEL_FILE) -> dict:
    """The committed model; a file whose features differ from this code's, or without its fitted families, is
    refused with one line."""
    model = json.loads(Path(path).read_text())
    if set(model.get("coef", {})) != set(FEATURES):
        raise ValueError(f"{path}: its features differ from aot/costmodel.py's; refit with `tune model-fit`")
    fit = model.get("fit")
    families = fit.get("families") if isinstance(fit, dict) else None
    if not isinstance(families, dict) or not families:
        # without it `select` would take every family for unseen and keep every candidate: no cut at all
        raise ValueError(
            f"{path}: field 'fit.families' (timings per kernel family) is missing; refit with `tune model-fit`"
        )
    return model


def predict_us(model: dict, cfg: KernelConfig, n: int, k: int) -> float:
    """The model's time of one config at one shape, in us."""
    coef = model["coef"]
    return math.exp(sum(coef[name] * value for name, value in features(cfg, n, k).items()))


def select(
    model: dict, configs: list[KernelConfig], n: int, k: int, top: int = TOP, per_family: int = PER_FAMILY
) -> list[KernelConfig]:
    """The ``top`` best predicted configs plus the ``per_family`` best of each family, fastest predicted first;
    every config of a family the model was fitted without (no timings: its features' terms are zero) is kept."""
    ranked = sorted(configs, key=lambda c: (predict_us(model, c, n, k), c.name))
    seen = model["fit"]["families"]
    keep = ranked[:top] + [c for c in ranked[top:] if family(c) not in seen]
    for fam in sorted({family(c) for c in ranked}):
        keep += [c for c in ranked if family(c) == fam and c not in keep][
            : max(0, per_family - sum(family(c) == fam for c in keep))
        ]
    order = {c: i for i, c in enumerate(ranked)}
    return sorted(set(keep), key=order.get)


# Fewest candidates a cell needs for its rank correlation to say something about the model.
MIN_RANKED = 3


def _rank_corr(a, b) -> float:
    import numpy as np

    if len(a) < 2:
        return 1.0
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def check(paths=None, tops=TOPS, per_family: int = PER_FAMILY, by: str = "shape") -> dict:
    """Held out by shape (per (N, K), fit without it and rank its cells' timings) or by M (``by="m"``: each token
    count predicted by a fit on the others); the summary and each cell."""
    import numpy as np

    t = load_timings(list(paths) if paths else committed_timings())
    if by == "m":
        shapes = np.array([f"m{c[3]}" for c in t.cell])
    else:
        shapes = np.array([f"{n}x{k}" for n, k in t.shape])
    cells = np.array(["|".join(map(str, c)) for c in t.cell])
    fam = np.array(t.family)
    per_cell = []
    for shape in sorted(set(shapes)):
        train = shapes != shape
        coef = _fit_arrays(t.x[train], t.log_us[train], [c for c, keep in zip(t.cell, train) if keep])
        for cell in sorted(set(cells[~train])):
            idx = np.where(cells == cell)[0]
            pred, us = t.x[idx] @ coef, np.exp(t.log_us[idx])
            order = np.argsort(pred, kind="stable")
            best = us.min()
            loss = {str(top): float(us[order[:top]].min() / best - 1) for top in tops}
            # the prepare cut: top TOP plus the best per_family of each family
            chosen = list(order[:TOP])
            for f in sorted(set(fam[idx])):
                chosen += [i for i in order if fam[idx][i] == f and i not in chosen][:per_family]
            per_cell.append(
                {
                    "cell": cell,
                    "candidates": len(idx),
                    "rank_corr": _rank_corr(pred, us),
                    "measured_rank_of_predicted_best": int((us < us[order[0]]).sum()) + 1,
                    "loss": loss,
                    "loss_prepare_cut": float(us[chosen].min() / best - 1),
                    "prepare_cut": len(set(chosen)),
                    "median_abs_rel_error": float(np.median(np.abs(np.exp(pred) / us - 1))),
                }
            )
    summary = {
        "cells": len(per_cell),
        "timings": len(t.log_us),
        "held_out_by": by,
        "shapes_held_out": len(set(shapes)),
        # over the cells with at least MIN_RANKED candidates: the re-measures of plan entries (`tune prepare
        # --from-plans`, one or two configs per cell) rank nothing
        "ranked_cells": sum(c["candidates"] >= MIN_RANKED for c in per_cell),
        "mean_rank_corr": float(np.mean([c["rank_corr"] for c in per_cell if c["candidates"] >= MIN_RANKED])),
        "median_measured_rank_of_predicted_best": float(
            np.median([c["measured_rank_of_predicted_best"] for c in per_cell])
        ),
        "mean_loss": {str(top): float(np.mean([c["loss"][str(top)] for c in per_cell])) for top in tops},
        "max_loss": {str(top): float(np.max([c["loss"][str(top)] for c in per_cell])) for top in tops},
        "cells_over_2pct": {str(top): int(sum(c["loss"][str(top)] > 0.02 for c in per_cell)) for top in tops},
        "prepare_cut": {
            "top": TOP,
            "per_family": per_family,
            "mean_size": float(np.mean([c["prepare_cut"] for c in per_cell])),
            "mean_loss": float(np.mean([c["loss_prepare_cut"] for c in per_cell])),
            "max_loss": float(np.max([c["loss_prepare_cut"] for c in per_cell])),
        },
        "median_abs_rel_error": float(np.median([c["median_abs_rel_error"] for c in per_cell])),
    }
    return {"summary": summary, "cells": per_cell}


def report(result: dict) -> str:
    """The held-out check as a few lines of text."""
    s = result["summary"]
    lines = [
        (
            f"cost model held out by {s['held_out_by']}: {s['cells']} cells, {s['timings']} timings, "
            f"{s['shapes_held_out']} groups (each predicted by a fit without it)"
        ),
        f"rank correlation (Spearman, mean over the {s['ranked_cells']} cells of >= {MIN_RANKED} candidates): {s['mean_rank_corr']:.3f}",
        f"measured rank of the predicted best (median): {s['median_measured_rank_of_predicted_best']:.0f}",
        f"time error |pred/us - 1| (median): {100 * s['median_abs_rel_error']:.1f}%",
        "best of the model's top N vs the true best: "
        + ", ".join(
            f"N={n}: mean +{100 * s['mean_loss'][n]:.2f}% max +{100 * s['max_loss'][n]:.1f}% "
            f"({s['cells_over_2pct'][n]} cells > 2%)"
            for n in s["mean_loss"]
        ),
        (
            f"`tune prepare` cut (top {s['prepare_cut']['top']} + best {s['prepare_cut']['per_family']} per family, "
            f"{s['prepare_cut']['mean_size']:.1f} per cell): mean +{100 * s['prepare_cut']['mean_loss']:.2f}% "
            f"max +{100 * s['prepare_cut']['max_loss']:.1f}%"
        ),
    ]
    return "\n".join(lines)


def main(phase: str, out: Path | None, by: str = "shape") -> str:
    """`tune model-fit` (write the model) or `tune model-check` (held-out report, per-cell JSON to ``out``)."""
    if phase == "model-fit":
        path = write(fit(), out or MODEL_FILE)
        return f"wrote {path}"
    result = check(by=by)
    if out:
        Path(out).write_text(dumps(result))
    return report(result)
