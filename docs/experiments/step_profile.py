"""Where the served step's time goes, kernel by kernel: cuBLAS vs our plan inside the same step graph.

    SKINNY_GEMM_ARTIFACTS=ROOT PYTHONPATH=SITE python docs/experiments/step_profile.py MODEL M OUT.json   (GPU)

Builds the bench's served step (aot/served.py: TP1 of the model's step file, M tokens), captures it with
cuBLAS and with skinny_gemm.linear as the GEMM, replays each graph under torch.profiler (CUPTI kernel records)
and sums the kernel durations per class (and keeps the last replay's kernels in start order: their overlap): our GEMM kernels (name starts with skinny_), cuBLAS GEMM kernels
(name has gemm/gemv/cutlass/sm90), and every other kernel (the ops' stand-ins); also the wall time per
replay, whose excess over the kernel sum is the idle time between kernels.
"""

import json
import sys
from pathlib import Path

import torch

import skinny_gemm
from skinny_gemm.aot import measure as ms
from skinny_gemm.aot import served

REPLAYS = 5


def classify(name: str) -> str:
    low = name.lower()
    if low.startswith("skinny_"):
        return "ours"
    if any(s in low for s in ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet")):
        return "cublas"
    return "ops"


def profile(graph) -> dict:
    graph.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        stop.record()
        torch.cuda.synchronize()
    sums, counts, names = {}, {}, {}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        c = classify(ev.name)
        us = ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
        sums[c] = sums.get(c, 0.0) + us / REPLAYS
        counts[c] = counts.get(c, 0) + 1
        names.setdefault(c, {})
        names[c][ev.name[:90]] = names[c].get(ev.name[:90], 0.0) + us / REPLAYS
    top = {c: dict(sorted(v.items(), key=lambda kv: -kv[1])[:8]) for c, v in names.items()}
    # the last replay's kernels in start order: (class, name, start us from the replay's first kernel, duration)
    kernels = sorted(
        (ev.time_range.start, ev.time_range.end, ev.name)
        for ev in prof.events()
        if ev.device_type == torch.autograd.DeviceType.CUDA
    )
    per = len(kernels) // REPLAYS
    last = kernels[-per:] if per else []
    t0 = last[0][0] if last else 0
    trace = [(classify(nm), nm[:60], round(a - t0, 2), round(b - a, 2)) for a, b, nm in last]
    return {"wall_us": start.elapsed_time(stop) * 1e3 / REPLAYS, "kernel_us": sums,
            "kernels_per_replay": {c: n / REPLAYS for c, n in counts.items()}, "top": top, "trace": trace}


def main():
    model_slug, m, dest = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    root = Path(skinny_gemm.__file__).resolve().parent / "kernels" / "models" / f"{model_slug}.json"
    model, built = served.build_served(root, [m])
    tp, m, ops = next(b for b in built if b[0] == 1)
    data = ms.step_data(ops, m, torch.device("cuda"))
    graphs = {
        "cublas": ms.capture(ms.step_calls(data, lambda x, w, out, n, k: torch.mm(x, w.T, out=out))),
        "ours": ms.capture(ms.step_calls(data, lambda x, w, out, n, k: skinny_gemm.linear(x, w))),
        "ops": ms.capture(ms.step_calls(data, None)),
    }
    result = {"gpu": torch.cuda.get_device_name(), "model": model_slug, "m": m, "tp": tp}
    for name in ("cublas", "ours", "ops", "ours", "cublas"):
        result.setdefault(name, []).append(profile(graphs[name]))
    dest.write_text(json.dumps(result, indent=1))
    for name in ("cublas", "ours", "ops"):
        for r in result[name]:
            print(name, f"wall {r['wall_us']:.0f} us", {c: round(v) for c, v in r["kernel_us"].items()},
                  {c: round(v) for c, v in r["kernels_per_replay"].items()}, flush=True)


if __name__ == "__main__":
    main()
