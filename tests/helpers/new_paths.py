"""The test-only variants of the new kernel paths (M up to 16, bias, K and N tails): new_paths.json.

The GPU machine has no cutlass, so the GPU tests cannot compile these: build them here into an extra
artifact dir, ``python tests/helpers/new_paths.py OUT [--arch sm_90a]`` (OUT/<arch>/manifest.json), and
point the GPU suite at it with SKINNY_TEST_NEW_PATHS=OUT; it loads them with loader.load_dir.
Each case has its own (n, k, m), so the manifest maps every variant and dispatch can be tested too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CASES_FILE = Path(__file__).with_name("new_paths.json")
ENV = "SKINNY_TEST_NEW_PATHS"


def cases(arch: str = "sm_90a"):
    """[(why, n, k, KernelConfig)] in the file's (n, k, m) order, those ``arch`` runs (kind "wgmma" and the mma
    ring: sm_90a only; the ring cases take up to 196 KB of shared memory, a GB10 CTA 99 KB)."""
    from skinny_gemm.kernels.config import KernelConfig

    rows = json.loads(CASES_FILE.read_text())["cases"]
    found = [(r["why"], r["n"], r["k"], KernelConfig.from_json(r["config"])) for r in rows]
    return [c for c in found if arch == "sm_90a" or not (c[3].kind == "wgmma" or c[3].ring)]


def build(arch: str, out_root: Path, cache_dir: Path | None = None) -> Path:
    """Compile every case for ``arch`` into out_root/<arch> (manifest maps each case's (n, k, m)); return that dir."""
    from skinny_gemm.aot import build as aot_build

    got = cases(arch)
    mapping = [{"n": n, "k": k, "m": cfg.m, "variant": cfg.name} for _, n, k, cfg in got]
    out = Path(out_root) / arch
    aot_build.build_configs(
        arch, [cfg for *_, cfg in got], mapping, out, CASES_FILE, cache_dir=cache_dir, progress=False
    )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="artifact root: the build goes to OUT/<arch>/")
    parser.add_argument("--arch", default="sm_90a", help="target (default sm_90a)")
    args = parser.parse_args(argv)
    print(build(args.arch, args.out))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
    import conftest  # noqa: F401  (the source tree as skinny_gemm)

    sys.exit(main())
