"""Direct kernel launches in GPU tests: the pointer a record takes as its weight."""

from __future__ import annotations

import torch


def weight_arg(rec, w) -> int:
    """The 2nd pointer of a ``driver.launch``: the weight, or for a "wgmma" record the device address of its tensor
    map (written on first use, on torch's current stream), as the runtime's own launch paths pass it."""
    if not rec.tma:
        return w.data_ptr()
    from skinny_gemm.runtime import tensormaps

    idx = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    return tensormaps.weight_map(idx, w.data_ptr(), rec.n, rec.k, rec.variant.config.cols, stream)
