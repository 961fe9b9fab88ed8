"""Does our down_proj kernel run fast only right after itself? Ordered kernel durations after a foreign kernel.

    SKINNY_GEMM_ARTIFACTS=ROOT PYTHONPATH=SITE python docs/experiments/own_predecessor.py OUT.json   (GPU)

Llama-3.1-8B's down_proj cell (4096x14336, M = 16, the planned record through skinny_gemm.linear), weights
cycling over 16 GiB of copies, CUDA graphs of 20 iterations of:
  add          add writing the tokens, down                       (30 us in predecessors.py)
  read         246 MB torch.sum, add, down                         (36 us)
  read_twice   246 MB torch.sum, add, down (another weight), add, down
  twice        add, down (another weight), add, down
  idle         torch.cuda._sleep (about 100 us of one spinning thread), add, down
  read_idle    246 MB torch.sum, _sleep, add, down
Per condition the CUPTI durations of our kernels in launch order (torch.profiler, 3 replays): for the "twice"
conditions the median of the first and of the second down of each iteration apart.
"""

import json
import statistics
import sys
from pathlib import Path

import torch
from gpu_timing import copies, kernel_events

import skinny_gemm
from skinny_gemm.aot import measure as ms

PER = 20


def main():
    dest = Path(sys.argv[1])
    gen = torch.Generator(device="cuda").manual_seed(19)
    n, k, m = 4096, 14336, 16
    ws = copies(n, k, 16 << 30, gen)
    big = torch.zeros(246 << 20 >> 1, device="cuda", dtype=torch.bfloat16).view(-1, 4096)
    acc = torch.empty(4096, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    x = src.clone()
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2 * PER)]

    def down(w, o):
        o.copy_(skinny_gemm.linear(x, w))

    def body(read: bool, twice: bool, idle: bool = False):
        for i in range(PER):
            if read:
                torch.sum(big, dim=0, out=acc)
            if idle:
                torch.cuda._sleep(200_000)
            if twice:
                torch.add(src, 0, out=x)
                down(ws[(2 * i + 1) % len(ws)], outs[PER + i])
            torch.add(src, 0, out=x)
            down(ws[(2 * i) % len(ws)], outs[i])

    result = {"gpu": torch.cuda.get_device_name(), "runs": {}}
    for label, read, twice, idle in (
        ("add", False, False, False),
        ("read", True, False, False),
        ("read_twice", True, True, False),
        ("twice", False, True, False),
        ("idle", False, False, True),
        ("read_idle", True, False, True),
    ):
        events = kernel_events(ms.capture([lambda r=read, t=twice, i=idle: body(r, t, i)]))
        us = [end - start for start, end, name in events if name.startswith("skinny_")]
        if twice:
            row = {"first": statistics.median(us[0::2]), "second": statistics.median(us[1::2])}
        else:
            row = {"down": statistics.median(us)}
        result["runs"][label] = {kk: round(v, 2) for kk, v in row.items()}
        print(label, result["runs"][label], flush=True)
    dest.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
