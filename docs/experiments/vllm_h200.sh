#!/usr/bin/env bash
# The end-to-end vLLM run on one H200 (device machine, no package index), from the repository root there:
#   vllm_h200.sh halve WH_DIR OUT_DIR   (here, not there) each part of WH_DIR as two folders OUT_DIR/p0, p1, ...:
#                                       with the tree at 40.7 MB a 26 MB part no longer fits the 64 MiB a call
#                                       carries; a file over 20 MB goes as NAME.a / NAME.b halves, joined by install
#   vllm_h200.sh stage PART_DIR         copy one wheelhouse part (vllm_wheelhouse.py --part-mb 40) into $HOME/wh
#   vllm_h200.sh install WHEEL          join halved files, assemble vLLM into $HOME/site, install the skinny-gemm
#                                       wheel beside it
#   vllm_h200.sh test [FILE...]         the GPU tests that need vLLM (a real engine) and the routed forward; FILE
#                                       (e.g. gpu/test_vllm_engine_gpu.py) runs one of them; the engine file alone
#                                       printed nothing in 330 s on 2026-12-03 (after a bench in that call: several
#                                       engines with compile), so give it a call of its own (timeout 590); in one
#                                       call of its own on 2026-12-04 its compiled arms' three tests passed and the
#                                       eager arms did not finish in 560 s, so run it as two calls, PYTEST_K=compiled
#                                       then PYTEST_K=eager (PYTEST_K passes to pytest -k)
#   vllm_h200.sh bench MODEL [ARGS...]  skinny-gemm bench --sections vllm for MODEL, results under $OUT/vllm-MODEL
#                                       (vllm-MODEL-$TAG with TAG set; $SKINNY_GEMM_ARTIFACTS passes to the engines)
# SITE_FIRST=DIR puts DIR before $HOME/site on PYTHONPATH: a second skinny-gemm wheel installed there
# (pip install --no-deps --target DIR) shadows the one beside vLLM, for an A/B of runtime code.
set -euo pipefail
SITE=$HOME/site
export PYTHONPATH=${SITE_FIRST:+$SITE_FIRST:}$SITE PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
case "$1" in
  halve)
    python3 - "$2" "$3" <<'PY'
import shutil, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
n = 0
for part in sorted(d for d in src.iterdir() if d.is_dir()):
    halves = [dst / f"p{n}", dst / f"p{n + 1}"]
    n += 2
    for h in halves:
        h.mkdir(parents=True)
    files = sorted(part.iterdir())
    small = [f for f in files if f.stat().st_size <= 20_000_000]
    for f in files:
        if f not in small:
            data = f.read_bytes()
            (halves[0] / (f.name + ".a")).write_bytes(data[: len(data) // 2])
            (halves[1] / (f.name + ".b")).write_bytes(data[len(data) // 2 :])
    total, half = 0, sum(f.stat().st_size for f in small) / 2
    for f in small:
        shutil.copy(f, halves[0] if total < half else halves[1])
        total += f.stat().st_size
print(" ".join(str(dst / f"p{i}") for i in range(n)))
PY
    ;;
  stage) mkdir -p "$HOME/wh" && cp "$2"/* "$HOME/wh/" && ls "$HOME/wh" | wc -l ;;
  install)
    (cd "$HOME/wh" && for a in *.a; do
       [ -e "$a" ] || continue
       cat "$a" "${a%.a}.b" > "${a%.a}" && rm "$a" "${a%.a}.b"
     done)
    (cd "$HOME/wh" && bash assemble.sh "$SITE" >/dev/null)
    python3 -m pip install -q --no-deps --no-index --target "$SITE" "$2"
    python3 -c "import vllm, skinny_gemm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    python3 -m skinny_gemm env | head -8 ;;
  test)
    shift
    files=("$@")
    [ ${#files[@]} -gt 0 ] || files=(gpu/test_vllm_engine_gpu.py gpu/test_vllm_forward_gpu.py)
    rm -rf /tmp/t && cp -r tests /tmp/t
    (cd /tmp/t && python3 -m pytest "${files[@]}" ${PYTEST_K:+-k "$PYTEST_K"} -q -p no:cacheprovider -rA 2>&1 \
      | tee -a "$OUT/gpu-tests-vllm.log") ;;
  bench)
    model=$2; shift 2
    name=vllm-$model${TAG:+-$TAG}  # TAG: a second bench of the model in one call (e.g. an A/B artifact folder)
    python3 -m skinny_gemm bench --sections vllm --model "$model" --out "$OUT/$name" "$@" 2>&1 \
      | tee "$OUT/$name.log" | grep -E "^vllm:|batch|skinny-gemm|Error|error|^\||^Counters|^Profile|^Engine|^TPOT|most GPU" ;;
esac
