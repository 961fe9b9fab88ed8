"""What really ran: launches of our kernels and fallbacks to F.linear with their reason, per (N, K, M).

The dispatch path (runtime/ops.py) counts every eager decision: a launch
handed to the driver, or a fallback and why; the vLLM route
(runtime/vllm_routes.py) counts the M it hands to vLLM's own apply as
"not planned". A launch recorded into a CUDA
graph is counted once, when captured: replays of the graph run no host code.
A call's key is (N, K, M) of the weight and tokens; a call whose arguments
have no such shape (not a matrix weight) counts under (0, 0, 0).

``SKINNY_GEMM_COUNTERS=<file>`` writes ``snapshot()`` as JSON to that file when
the process exits (``{pid}`` in the name is replaced by the process id, for
servers with several workers).
"""

from __future__ import annotations

import atexit
import json
import os
from collections import Counter

ENV_COUNTERS = "SKINNY_GEMM_COUNTERS"

# Why a call fell back: the reasons the dispatch path counts.
TYPE = "type"  # a tensor subclass without its own storage (FakeTensor, DTensor, ...) or not a tensor
DEVICE = "device"  # not a CUDA tensor, or the tensors on different GPUs
DTYPE = "dtype"  # not bf16
SHAPE = "shape"  # not a (N, K) weight with matching tokens, residual or bias
AUTOGRAD = "autograd"  # gradients or forward AD asked for
CONTIGUITY = "contiguity"  # a strided view or a negative-bit view
ALIGNMENT = "alignment"  # a pointer not 16-byte aligned (or no storage)
EXTRA = "bias/residual"  # both at once, or one the planned variant does not take
NOT_PLANNED = "not planned"  # no plan entry for (N, K, M) on this GPU; the vLLM route: M not among its layer's
NO_KERNELS = "no kernels"  # no loaded manifest for this GPU (no artifacts for its arch, refused, no driver)
DEFERRED = "capture deferral"  # a first use inside a graph capture that could not bind its kernel there
REFUSED = "refused"  # the variant was refused (host check or driver), or the driver refused the launch

# (n, k, m) -> launches handed to the driver.
LAUNCHES: Counter = Counter()
# (n, k, m, reason) -> calls that ran F.linear.
FALLBACKS: Counter = Counter()


def snapshot() -> dict:
    """``{"launches": [[n, k, m, count]...], "fallbacks": [[n, k, m, reason, count]...]}``, sorted: plain data."""
    return {
        "launches": [[n, k, m, c] for (n, k, m), c in sorted(LAUNCHES.items())],
        "fallbacks": [[n, k, m, r, c] for (n, k, m, r), c in sorted(FALLBACKS.items())],
    }


def reset() -> None:
    """Zero both counters (e.g. after warm-up, to count only what follows)."""
    LAUNCHES.clear()
    FALLBACKS.clear()


def _write(path: str) -> None:
    try:
        with open(path.replace("{pid}", str(os.getpid())), "w") as f:
            json.dump({"pid": os.getpid(), **snapshot()}, f, indent=1, sort_keys=True)
    except OSError as exc:  # the exit of a server must not fail on a report
        print(f"skinny_gemm: {ENV_COUNTERS}={path}: cannot write the counters: {exc}")


def dump_at_exit() -> None:
    """Register the exit-time write when $SKINNY_GEMM_COUNTERS names a file (called once, at import of the API)."""
    path = os.environ.get(ENV_COUNTERS)
    if path:
        atexit.register(_write, path)
