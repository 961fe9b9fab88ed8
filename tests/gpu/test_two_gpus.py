"""Two GPUs (issue 16): one process per GPU as vLLM's tensor parallelism runs them, and one process using both.

Ranks: ``torch.multiprocessing`` + ``torch.distributed`` (NCCL), every GPU visible to every rank,
``torch.cuda.set_device(rank)``; each rank runs every planned cell, eagerly and under CUDA graph replay,
against the float64 bound, and all-reduces its outputs as a row-parallel layer would, compared with the
same all-reduce of F.linear's. One process: handles bound per device, a call on one GPU never launches a
function bound to the other, the first call on each GPU inside a capture. Runs from a copy of tests/
against the installed wheel (README, Testing), or from the checkout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import skinny_gemm

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
TESTS = str(Path(__file__).resolve().parent.parent)


def _prelude() -> str:
    """Code that imports the same skinny_gemm this process uses (installed or source tree) and helpers."""
    init = Path(skinny_gemm.__file__).resolve()
    pkg = Path(skinny_gemm.__path__[0]).resolve()
    return (
        "import importlib.util, json, os, sys\n"
        f"sys.path.insert(0, {TESTS!r})\n"
        "if 'skinny_gemm' not in sys.modules:\n"
        f"    spec = importlib.util.spec_from_file_location('skinny_gemm', {str(init)!r}, "
        f"submodule_search_locations=[{str(pkg)!r}])\n"
        "    mod = importlib.util.module_from_spec(spec)\n"
        "    sys.modules['skinny_gemm'] = mod\n"
        "    spec.loader.exec_module(mod)\n"
    )


# Shared by both scripts: a spy on the dispatch path's launches, and the checks of one cell.
COMMON = '''
import torch, torch.nn.functional as F
import skinny_gemm
from skinny_gemm.runtime import driver, loader, ops
from helpers.reference import allowed, assert_within_bound, poison_, random_tensor

LAUNCHES = []
_real = driver.launch_raw


def _spy(rec, *args):
    LAUNCHES.append((torch.cuda.current_device(), rec))
    return _real(rec, *args)


driver.launch_raw = _spy


def check_cell(dev, n, k, m, gen, what):
    """Eager and graph-replayed calls of one planned cell on ``dev``, with and without its 4th pointer (a residual,
    or a bias where the planned variant is a bias variant: that one refuses a residual)."""
    cfg = skinny_gemm.plan_for(n, k, m, dev)
    assert cfg is not None, f"{what} {(n, k, m)}: no plan on {dev}"
    w = random_tensor((n, k), dev, 0.05, generator=gen)
    for with_extra in (False, True):
        x = random_tensor((m, k), dev, generator=gen)
        b = random_tensor((n,), dev, generator=gen) if with_extra and cfg.bias else None
        r = random_tensor((m, n), dev, generator=gen) if with_extra and not cfg.bias else None
        added = b.expand(m, n) if b is not None else r
        assert ops.plan(x, w, r, b) is not None, f"{what} {(n, k, m)}: not planned on {dev}"
        y = skinny_gemm.linear(x, w, b, residual=r)
        assert_within_bound(y, x, w, added, what=f"{what} eager {(n, k, m)} extra={with_extra}")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = skinny_gemm.linear(x, w, b, residual=r)
        poison_(yg)
        g.replay()
        torch.cuda.synchronize(dev)
        assert_within_bound(yg, x, w, added, what=f"{what} graph {(n, k, m)} extra={with_extra}")
    return w


def own_functions(ordinal):
    return {id(f) for f in loader.DEVICES[ordinal].functions.values()}
'''

RANKS = """
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    dev = torch.device("cuda", rank)
    torch.empty(1, device=dev)
    loader.ensure_loaded()
    table = loader.DEVICES[rank]
    assert table.library is not None and table.library.manifest is not None, table
    cells = sorted(table.library.manifest.plans)
    gen = torch.Generator(device=dev).manual_seed(1000 + rank)
    reduced = 0
    for n, k, m in cells:
        w = check_cell(dev, n, k, m, gen, f"rank {rank}")
        # A row-parallel layer: each rank's partial product, summed across ranks.
        x = random_tensor((m, k), dev, generator=gen)
        y, yf = skinny_gemm.linear(x, w), F.linear(x, w)
        ref, bound = allowed(x, w)
        for t in (y, yf, ref, bound):
            dist.all_reduce(t)
        # The bf16 all-reduce rounds each partial sum once more.
        slack = bound + world * 2.0**-8 * ref.abs()
        for name, got in (("skinny_gemm", y), ("F.linear", yf)):
            err = (got.double() - ref).abs()
            assert bool((err <= slack).all()), f"rank {rank} {(n, k, m)}: all-reduced {name} out of bound"
        reduced += 1
    mine = own_functions(rank)
    wrong = [(cur, rec.variant.id) for cur, rec in LAUNCHES if cur != rank or id(rec.function) not in mine]
    assert not wrong, f"rank {rank} launched on another device or with another device's function: {wrong[:5]}"
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"cells": len(cells), "reduced": reduced, "launches": len(LAUNCHES),
                   "functions": len(mine), "gpu": torch.cuda.get_device_name(rank)}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    out, port = sys.argv[1], int(sys.argv[2])
    world = torch.cuda.device_count()
    mp.spawn(worker, args=(world, port, out), nprocs=world, join=True)
    print(json.dumps({"world": world}))
"""

ONE_PROCESS = """
from skinny_gemm.runtime import diagnostics

world = torch.cuda.device_count()
caps = {torch.cuda.get_device_capability(i) for i in range(world)}
for i in range(world):
    torch.empty(1, device=f"cuda:{i}")  # torch's contexts exist; nothing bound yet
loader.ensure_loaded()
# Variants load and bind at their first call: nothing of any is loaded or bound yet.
unbound = [not loader.DEVICES[i].functions and not loader.DEVICES[i].library.kernels
           and (loader.DEVICES[i].table is None or not loader.DEVICES[i].table.bound) for i in range(world)]
(n, k, m) = sorted(loader.DEVICES[0].library.manifest.plans)[0]
seen = {}
for d in range(world):
    dev = torch.device("cuda", d)
    gen = torch.Generator(device=dev).manual_seed(d)
    x = random_tensor((m, k), dev, generator=gen)
    w = random_tensor((n, k), dev, 0.05, generator=gen)
    start = len(LAUNCHES)
    with torch.cuda.device(d):  # the very first call on this GPU happens inside a capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = skinny_gemm.linear(x, w)
        poison_(y)
        g.replay()
        torch.cuda.synchronize(d)
    assert_within_bound(y, x, w, what=f"first call inside a capture on GPU {d}")
    with torch.cuda.device((d + 1) % world):  # called while another GPU is current
        y2 = skinny_gemm.linear(x, w)
    torch.cuda.synchronize(d)
    assert_within_bound(y2, x, w, what=f"GPU {d} called while GPU {(d + 1) % world} is current")
    seen[d] = LAUNCHES[start:]
functions = [own_functions(i) for i in range(world)]
for d, launches in seen.items():
    assert launches, f"nothing launched on GPU {d}"
    for cur, rec in launches:
        assert cur == d, f"a call on GPU {d} launched with GPU {cur} current"
        assert id(rec.function) in functions[d], f"a call on GPU {d} used a function bound elsewhere"
        assert all(id(rec.function) not in functions[o] for o in range(world) if o != d)
report = diagnostics.env_report()
print(json.dumps({"world": world, "caps": sorted(caps), "unbound_at_load": unbound,
                  "gpus_in_env": [f"GPU {i}:" in report for i in range(world)], "env": report}))
"""


def _run(script: str, *args, timeout=400) -> dict:
    out = subprocess.run(
        [sys.executable, script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=dict(os.environ),
    )
    assert out.returncode == 0, f"{script} failed:\n{out.stdout}\n{out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _same_capability():
    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    if len(caps) != 1:
        pytest.skip(f"GPUs of different capabilities {sorted(caps)}")


def test_one_rank_per_gpu_like_vllm(tmp_path):
    _same_capability()
    script = tmp_path / "ranks.py"
    script.write_text(_prelude() + COMMON + RANKS)
    res = _run(str(script), str(tmp_path), str(_free_port()))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(res["world"])]
    print("\n" + "\n".join(f"rank {r}: {info}" for r, info in enumerate(ranks)))
    assert all(info["cells"] > 0 and info["reduced"] == info["cells"] and info["launches"] > 0 for info in ranks)


def test_one_process_both_gpus(tmp_path):
    _same_capability()
    script = tmp_path / "both.py"
    script.write_text(_prelude() + COMMON + ONE_PROCESS)
    res = _run(str(script))
    print("\n" + res["env"])
    assert all(res["gpus_in_env"]), "skinny-gemm env lists every GPU"
    assert all(res["unbound_at_load"]), "variants bind at first use: nothing was bound before the captures"
