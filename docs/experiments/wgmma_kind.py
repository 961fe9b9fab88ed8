"""CPU half of the "wgmma" kind's first measurement: compile a sweep of kernels/skinny_wgmma.py variants.

    python docs/experiments/wgmma_kind.py OUT_DIR        (cubins + OUT_DIR/variants.json with each config)
    python docs/experiments/wgmma_kind_run.py OUT_DIR OUT.json    (GPU, no cutlass)

The sweep: m in 1, 2, 4, 8, 16; one or two consumer warpgroups; 4-12 stages; cluster K split 1, 2, 4; plus a bias
variant per m (the residual runs on every other variant). Only configs the config check accepts.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "aot"))
import source_tree  # noqa: E402


def sweep():
    from skinny_gemm.kernels.config import ConfigError, KernelConfig

    out = []
    for m in (1, 2, 4, 8, 16):
        for consumers in (1, 2):
            for stages in (4, 6, 8, 12):
                for split in (1, 2, 4):
                    for bias in (False, True):
                        if bias and (consumers, stages, split) != (1, 8, 1):
                            continue
                        t = 128 * (1 + consumers)
                        cfg = KernelConfig(m=m, kind="wgmma", threads=t, k_threads=t, cols=64 * consumers, unroll=1,
                                           stages=stages, split=split, prefetch=False, bias=bias)
                        try:
                            cfg.check()
                        except ConfigError:
                            continue
                        out.append(cfg)
    return out


def main(out_dir: Path) -> None:
    source_tree.register(run_init=False)
    from skinny_gemm.kernels.skinny_wgmma import compile_variant

    (out_dir / "dump").mkdir(parents=True, exist_ok=True)  # the DSL writes the cubin only into an existing dump dir
    table = {}
    for cfg in sweep():
        blob = compile_variant(cfg, "sm_90a", str(out_dir / "dump"))
        (out_dir / f"{cfg.name}.cubin").write_bytes(blob)
        shape = cfg.launch()
        table[cfg.name] = {"config": cfg.to_json(), "symbol": cfg.symbol, "threads": cfg.threads, "rows": cfg.cols,
                           "split": cfg.split, "smem": shape.smem, "m": cfg.m, "bias": cfg.bias}
        print(cfg.name, len(blob), flush=True)
    (out_dir / "variants.json").write_text(json.dumps(table, indent=1, sort_keys=True))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    main(Path(sys.argv[1]))
