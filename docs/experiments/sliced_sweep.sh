#!/usr/bin/env bash
# Sliced "mma" sweeps in the served step, bundled for one H200 call: sliced tiles at M = 8 (the 2026-12-03 runs'
# grid) and at M = 16 with the tokens in groups of 8 or 4 (token_groups; perf.md, Next 0)
# and their register buffers as deep as the weight's or 2 (token_stages),
# each timed beside the committed plan's configs and the model's last sliced / ring2 / sliced-sweep run's fastest, cuBLAS
# competing in every cell. From the repository root:
#   sliced_sweep.sh prepare BUNDLE SLUG:TP:M [...]   CPU: a worktree of HEAD, per spec
#                          the candidates of each (N, K) the model has at that TP (token groups 2 and 4 and
#                          token stages 2 at M = 16), one `tune prepare` (compiles) into BUNDLE/cells-SLUG-tpTP-mM, then the
#                          tree's sm_90a wheel into BUNDLE/whl. BUNDLE under .device/ is ignored by git,
#                          so a `run` call carries it (carry [".device/NAME"]).
#   sliced_sweep.sh measure BUNDLE [NAME...]        H200: install that wheel, `tune measure` every cells folder
#                          (or only cells-NAME, e.g. qwen3-8b-tp1-m16: one call per model if four run past a
#                          call's limit) with decode top 8, 2 passes and the confirm step; results and logs in
#                          $OUT/sweep.tgz (a call brings back 8 files at most), after the bundle's new-path GPU
#                          tests (every new kernel path against float64).
#                          A step that fails is reported, the next one still runs, and the exit status is 1.
# DECODE_MIN_SPEEDUP (default 1.05, the plan's rule) admits near-ties to measure's decode phase (e.g. 0.97: cells whose
# kernels only tie cuBLAS alone are tried in the step). TEST_TIMEOUT (default 300 s) bounds the new-path tests and FOLDER_TIMEOUT (default none) each folder's measure.
# TILES (default 1,2,4,8) and MIN_CTAS (default 0; e.g. 2,3,4 adds the launch-bound twins, perf.md Next 0) pass
# through to sliced_candidates.py; SPACE=NAME takes a candidate space's configs instead (space_candidates.py:
# SPACE=walk, the mma walk); RUN (default sliced-sweep) names measure's result files,
# tune-sm_90a-h200-NAME-RUN.json, so a second sweep of a model does not take the committed run's name.
# e.g. prepare .device/sweep llama-3.1-8b:1:16 qwen3-8b:1:16 qwen3-32b:1:8 llama-3.1-70b:4:8 (2026-12-03: 8 min
# of compiling here from an empty cache, 24 MB; 1938 / 1989 / 477 / 604 timings, about 3 min of H200 time by tune prepare's estimate before
# the decode phases; measured on the H200 the same day: 71 s for the Llama-3.1-8B folder with the new-path tests,
# 194 s for the other three in one call), then measure. measure installs the bundle's own wheel, so the timed
# cubins are the ones prepare compiled.
set -euo pipefail
usage="usage: sliced_sweep.sh prepare BUNDLE SLUG:TP:M [...] | measure BUNDLE [NAME...]"
cmd=${1:?$usage}
bundle=${2:?$usage}
PY=${PYTHON:-python}
# prepare runs inside a worktree: a relative interpreter path (.venv/bin/python) must not move with it
case $PY in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") ;; esac
case "$cmd" in
  prepare)
    shift 2
    [ $# -gt 0 ] || { echo "sliced_sweep.sh: give at least one SLUG:TP:M (e.g. llama-3.1-8b:1:16)" >&2; exit 2; }
    root=$(git rev-parse --show-toplevel)
    mkdir -p "$bundle"
    bundle=$(cd "$bundle" && pwd)
    scratch=$(mktemp -d)
    tree=$scratch/tree
    trap 'git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
    git worktree add -q --detach "$tree" HEAD
    cd "$tree"
    for spec in "$@"; do
      IFS=: read -r slug tp m <<<"$spec"
      [ -n "$m" ] || { echo "sliced_sweep.sh: '$spec' is not SLUG:TP:M" >&2; exit 2; }
      name=$slug-tp$tp-m$m
      groups=1 lead=0
      [ "$m" -gt 8 ] && groups=2,4 lead=0,2
      echo "== $name: candidates, token groups $groups, token stages $lead ($(date +%T))"
      # the model's candidate (N, K) at that TP, as the catalogue reader gives them (aot/models.py)
      shapes=$("$PY" - "$slug" "$tp" <<'EOF'
import sys
sys.path.insert(0, "aot")
import source_tree

source_tree.register(run_init=False)
from skinny_gemm.aot import models

slug, tp = sys.argv[1], int(sys.argv[2])
print(" ".join(f"{n},{k}" for n, k in sorted(models.shapes(models.load(slug), tp))))
EOF
)
      [ -n "$shapes" ] || { echo "sliced_sweep.sh: kernels/models/$slug.json has no candidate shape at TP $tp" >&2; exit 2; }
      rm -rf "$bundle/plans-$name" "$bundle/cells-$name"
      if [ -n "${SPACE:-}" ]; then
        # one space of kernels/candidates.json instead of the sliced grid (SPACE=walk: the mma walk), PDL on and off
        "$PY" docs/experiments/space_candidates.py "$bundle/plans-$name" "$SPACE" $shapes --m "$m" --pdl-twins
        if ! ls "$bundle/plans-$name"/sl-*.json >/dev/null 2>&1; then
          echo "== $name: skipped (no $SPACE config for its shapes)"
          continue
        fi
      else
        "$PY" docs/experiments/sliced_candidates.py "$bundle/plans-$name" $shapes --m "$m" --token-groups "$groups" \
          --tiles "${TILES:-1,2,4,8}" --token-stages "$lead" --min-ctas "${MIN_CTAS:-0}"
      fi
      earlier=()
      for run in sliced ring2 "m$m-sliced-sweep" "m$m-bounds-sweep" "m$m-walk"; do
        f=kernels/plans/tuning/sm_90a/tune-sm_90a-h200-$slug-tp$tp-$run.json
        [ -f "$f" ] && earlier+=("$f")
      done
      echo "== $name: tune prepare, beside ${earlier[*]:-the plan only} ($(date +%T))"
      "$PY" aot/source_tree.py tune prepare --arch sm_90a --model "$slug" --tp "$tp" --m "$m" \
        --from-plans "$bundle/plans-$name"/sl-*.json kernels/plans/sm_90a.json \
        ${earlier[@]:+--from-results "${earlier[@]}"} --out "$bundle/cells-$name"
      rm -rf "$bundle/plans-$name"
    done
    echo "== wheel ($(date +%T))"
    rm -rf "$bundle/whl"
    "$PY" -m pip wheel -q . --no-deps -w "$bundle/whl" -C skinny.archs=sm_90a
    # the GPU correctness cases of the tree (token groups, the epilogue's turns, tails, bias) and the tests
    # that run them, so the call checks every new kernel path against float64 before it times anything
    echo "== new-path variants ($(date +%T))"
    rm -rf "$bundle/new-paths" "$bundle/tests"
    "$PY" tests/helpers/new_paths.py "$bundle/new-paths" >/dev/null
    cp -r tests "$bundle/tests"
    git -C "$root" rev-parse HEAD > "$bundle/commit.txt"
    du -sh "$bundle"
    echo "next (H200): bash docs/experiments/sliced_sweep.sh measure ${bundle#"$root"/}   (carry that folder)" ;;
  measure)
    shift 2
    site=$(mktemp -d)/site
    python3 -m pip install -q --no-deps --no-index --target "$site" "$bundle"/whl/*.whl
    folders=()
    if [ $# -gt 0 ]; then
      for name in "$@"; do folders+=("$bundle/cells-$name"); done
    else
      folders=("$bundle"/cells-*)
    fi
    failed=0
    bundle=$(cd "$bundle" && pwd)
    tests=$(mktemp -d)/tests  # outside the checkout: the root conftest.py would put the source tree in place
    cp -r "$bundle/tests" "$tests"
    echo "== new-path GPU tests ($(date +%T))"
    # a kernel that never finishes (a wrong TMA byte count hangs its mbarrier wait) must not take the call with it
    if ! (cd "$tests" && PYTHONPATH=$site SKINNY_TEST_NEW_PATHS=$bundle/new-paths \
      timeout -k 10 "${TEST_TIMEOUT:-300}" python3 -m pytest gpu/test_runtime_gpu.py -k new_paths -q -p no:cacheprovider -rA) >"$OUT/gpu-new-paths.log" 2>&1; then
      echo "== new-path GPU tests FAILED (gpu-new-paths.log)"
      failed=1
    fi
    tail -5 "$OUT/gpu-new-paths.log"
    for cells in "${folders[@]}"; do
      name=${cells##*/cells-}
      echo "== $name ($(date +%T))"
      if ! PYTHONPATH=$site timeout -k 10 "${FOLDER_TIMEOUT:-0}" python3 -m skinny_gemm tune measure "$cells" \
        --results "$OUT/tune-sm_90a-h200-$name-${RUN:-sliced-sweep}.json" --decode-top 8 --decode-passes 2 --decode-min-speedup "${DECODE_MIN_SPEEDUP:-1.05}" \
        >"$OUT/tune-$name.log" 2>&1; then
        echo "== $name FAILED (its log: tune-$name.log)"
        failed=1
      fi
      tail -40 "$OUT/tune-$name.log"
    done
    # a device call brings back at most 8 files: one archive of every results file and log
    (cd "$OUT" && tar czf sweep.tgz tune-*.json tune-*.log gpu-new-paths.log 2>/dev/null \
      && rm -f tune-*.json tune-*.log gpu-new-paths.log && echo "== results and logs in \$OUT/sweep.tgz")
    exit $failed ;;
  *) echo "sliced_sweep.sh: unknown command '$cmd' ($usage)" >&2; exit 2 ;;
esac
