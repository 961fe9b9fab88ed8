"""Compile the planned config of a few sm_90a cells next to its no-PDL twin (CPU), for decode_breakdown.py.

Usage, from the checkout: python docs/experiments/pdl_variants_build.py OUT_DIR
Writes OUT_DIR/cells.json and OUT_DIR/sm_90a/ (cubins + manifest, no plans).
"""

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "aot"))
import source_tree  # noqa: E402

source_tree.register()
from skinny_gemm.aot.build import build_configs  # noqa: E402
from skinny_gemm.runtime.config import KernelConfig  # noqa: E402

CELLS = [(6416, 4096, 1), (6416, 4096, 4), (2048, 128, 1), (2048, 128, 4), (4096, 2048, 1), (4096, 2048, 4), (1024, 128, 1)]

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
plan = json.loads((ROOT / "kernels" / "plans" / "sm_90a.json").read_text())
configs, rows = {}, []
for e in plan["entries"]:
    if (e["n"], e["k"], e["m"]) in CELLS:
        cfg = KernelConfig.from_json(e["config"])
        pair = [cfg, dataclasses.replace(cfg, pdl=False, early=False, prefetch=False)]
        rows.append({"n": e["n"], "k": e["k"], "m": e["m"], "variants": [c.name for c in pair]})
        configs.update({c.name: c for c in pair})
(out / "cells.json").write_text(json.dumps(rows, indent=1))
build_configs("sm_90a", configs.values(), [], out / "sm_90a", out / "cells.json", jobs=2, progress=False)
print(f"{len(configs)} variants -> {out}")
