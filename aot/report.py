"""The bench's reports: the markdown of every section and the two plots (matplotlib optional)."""

from __future__ import annotations

import math
from pathlib import Path


def geomean(values) -> float:
    """Geometric mean."""
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(data: dict) -> str:
    """The human-readable report."""
    lines = [f"# skinny-gemm bench: {data.get('gpu', '?')}, {data['date']}", "", f"Command: `{data['command']}`", ""]
    if "entries" in data:
        rows = data["entries"]
        lines += [
            f"## Plan entries ({len(rows)} cells; geomean speedup {geomean(r['speedup'] for r in rows):.3f}x, "
            + ", ".join(
                f"M={m}: {geomean(r['speedup'] for r in rows if r['m'] == m):.3f}x"
                for m in sorted({r["m"] for r in rows})
            )
            + ")",
            "",
            "| N | K | M | cuBLAS us | plan us | speedup | plan % of 4.8 TB/s | variant |",
            "|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['n']} | {r['k']} | {r['m']} | {r['cublas_us']:.2f} | {r['plan_us']:.2f} | "
                f"{r['speedup']:.2f}x | {r['plan_bw_pct']:.1f}% | {r['variant']} |"
            )
        lines.append("")
    if "decode" in data:
        lines += [
            "## Decode step (one CUDA graph per rank, 192 GEMMs)",
            "",
            "| TP | M | planned GEMMs | weights GB | cuBLAS us | plans us | speedup | cuBLAS+ew us | plans+ew us | speedup |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in data["decode"]:
            lines.append(
                f"| {r['tp']} | {r['m']} | {r['planned_gemms']}/{r['gemms']} | {r['weight_gb']:.3f} | "
                f"{r['cublas_us']:.0f} | {r['plan_us']:.0f} | {r['cublas_us'] / r['plan_us']:.2f}x | "
                f"{r['cublas+ew_us']:.0f} | {r['plan+ew_us']:.0f} | {r['cublas+ew_us'] / r['plan+ew_us']:.2f}x |"
            )
        lines.append("")
    if "served" in data:
        lines += served_markdown(data["served"], data.get("served_about", {}))
    if "startup" in data:
        s = data["startup"]
        lines += [
            "## Startup",
            "",
            (
                f"import + load of {s['variants']} variants ({s['plans']} plans): median {s['import_and_load_ms']:.1f} ms "
                f"(runs: {', '.join(f'{v:.1f}' for v in s['runs_ms'])} ms)"
            ),
            "",
        ]
    if "jit" in data:
        j = data["jit"]
        lines += [
            "## JIT compile of the same variants (CPU machine)",
            "",
            (
                f"{j['variants']} {j['arch']} variants: `import cutlass.cute` {j['cutlass_import_s']:.2f} s + compile "
                f"{j['compile_total_s']:.1f} s (median {j['compile_median_s']:.2f} s per variant; {j['note']})"
            ),
            "",
        ]
    return "\n".join(lines)


def served_markdown(rows: list, about: dict) -> list[str]:
    """The served-step section: whole step, ops alone, the projections' share, the bare chain, the peer."""
    peer = any("peer+step" in r["us"] for r in rows)
    lines = [
        f"## Served decode step: {about.get('model', '?')} ({about.get('file', '')})",
        "",
        f"Step: {about.get('about', '')}",
        "",
        "One CUDA graph per (TP, M), cold L2 (every weight and stand-in buffer read from HBM). "
        "share = step - ops alone (the projections' part of the served step); speedups over cuBLAS. "
        "Bare chain: the same projections back to back without the ops (the kernels' own ceiling: "
        "no server runs it)."
        + (f" Peer: vLLM {about.get('peer_version')} CuteSkinnyGemm, use_pdl off / on." if peer else ""),
        "",
        "| TP | M | planned | cuBLAS step us | ours step us | step speedup | ops alone us | ours share us | "
        "share speedup |" + (" peer share speedup (pdl off / on) |" if peer else "") + " bare chain speedup |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if peer else "") + "---:|",
    ]
    for r in rows:
        t, sp = r["us"], r["speedup"]
        if "ours+step" in t:
            ours = (
                f"{t['ours+step']:.0f} | {sp['step']['ours']:.2f}x | {t['ops']:.0f} | {r['share_us']['ours']:.0f} | "
                f"{sp['share'].get('ours', float('nan')):.2f}x"
            )
            bare = f"{sp['bare']['ours']:.2f}x"
        else:
            ours, bare = f"no plan | | {t['ops']:.0f} | no plan | no plan", "no plan"
        peer_col = ""
        if peer:
            peer_col = (
                f" {sp['share'].get('peer', float('nan')):.2f}x / {sp['share'].get('peer_pdl', float('nan')):.2f}x |"
            )
        lines.append(
            f"| {r['tp']} | {r['m']} | {r['planned_gemms']}/{r['gemms']} | {t['cublas+step']:.0f} | {ours} |"
            f"{peer_col} {bare} |"
        )
    lines.append("")
    return lines


def _pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_decode(data: dict, path: Path) -> bool:
    """Share speedups of the served step per (TP, M), with the bare chain as a labelled second panel."""
    plt = _pyplot()
    if plt is None:
        return False
    rows = data.get("served", [])
    if not rows:
        return False
    about = data.get("served_about", {})
    labels = [f"TP{r['tp']} M{r['m']}" for r in rows]
    providers = [p for p in ("ours", "peer", "peer_pdl") if any(p in r["speedup"]["share"] for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(max(10, len(rows) * 0.9), 4.5), sharey=True)
    for ax, key, title in (
        (axes[0], "share", "served step: projections' share (step - ops)"),
        (axes[1], "bare", "bare chain (projections back to back)"),
    ):
        width = 0.8 / max(1, len(providers))
        for j, p in enumerate(providers):
            ax.bar(
                [i + j * width for i in range(len(rows))],
                [r["speedup"][key].get(p, 0) for r in rows],
                width=width,
                label=p,
            )
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], labels, rotation=60, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("speedup over cuBLAS")
    fig.suptitle(
        f"{about.get('model', '')} decode step, {data.get('gpu', '')}, {data['date']} ({about.get('file', '')})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def plot(data: dict, path: Path) -> bool:
    """Speedup per plan entry as a shape x M grid, each cell labelled; False if matplotlib is missing.

    A grid, not bars: a plan of 100+ entries as bars had labels too small to read.
    """
    plt = _pyplot()
    if plt is None:
        return False
    rows = data.get("entries", [])
    if not rows:
        return False
    shapes = sorted({(r["n"], r["k"]) for r in rows}, key=lambda nk: (nk[0] * nk[1], nk))
    ms = sorted({r["m"] for r in rows})
    cell = {(r["n"], r["k"], r["m"]): r["speedup"] for r in rows}
    grid = [[cell.get((n, k, m), float("nan")) for m in ms] for n, k in shapes]
    fig, ax = plt.subplots(figsize=(2.2 + 0.9 * len(ms), 1.2 + 0.28 * len(shapes)))
    from matplotlib.colors import TwoSlopeNorm

    # Centred on 1.0: red only where cuBLAS wins.
    image = ax.imshow(grid, cmap="RdYlGn", norm=TwoSlopeNorm(vmin=0.8, vcenter=1.0, vmax=2.0), aspect="auto")
    for i, line in enumerate(grid):
        for j, value in enumerate(line):
            if value == value:  # not NaN: a planned cell
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(ms)), [f"M={m}" for m in ms], fontsize=8)
    ax.set_yticks(range(len(shapes)), [f"{n} x {k}" for n, k in shapes], fontsize=7)
    ax.set_ylabel("weight (N x K), smallest first")
    fig.colorbar(image, ax=ax, label="speedup over cuBLAS (blank: not planned)")
    ax.set_title(f"plans vs cuBLAS, cold L2, graph replay\n{data.get('gpu', '')}, {data['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True
