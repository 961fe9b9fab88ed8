"""The torch side: the dispatch decision, the launch on torch's current stream, and the ``skinny_gemm::linear`` op.

Eager calls go straight to ``run`` (no dispatcher round trip: the host cost of
one call is the point on short GEMMs); graph capture records that launch like
any other. Under torch.compile, export or a dispatch mode, calls go through the
custom op, whose fake runs F.linear on fake tensors, so tracing sees one opaque
op with F.linear's output metadata and errors.
"""

import warnings

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad as _fwad

from . import loader

_BF16 = torch.bfloat16
# Plain tensors only: a subclass (FakeTensor, DTensor, ...) has no data pointer
# we may hand to a kernel, and F.linear knows how to treat it.
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# The raw calls behind torch.cuda.current_stream / current_device, without their Python wrappers.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_failed: set = set()


def fallback(x, weight, bias=None, residual=None):
    """F.linear(x, weight, bias) (+ residual): the reference result and the reference errors."""
    y = F.linear(x, weight, bias)
    return y if residual is None else y + residual


def plan(x, weight, residual=None, bias=None) -> loader.Launch | None:
    """The launch record that would run for these eager tensors, or None (then F.linear runs).

    A bias runs only on a bias variant (whose 4th pointer is the bias); a residual only on a
    variant without bias; both at once always fall back (the 40-byte ABI has one extra pointer).
    """
    try:
        return _plan(x, weight, residual, bias)
    except (RuntimeError, NotImplementedError):  # sparse, nested, mkldnn...: F.linear knows what to do
        return None
    except Warning:  # a refusal warned under -W error: the variant is already refused, the call falls back
        return None


def _plan(x, weight, residual, bias):
    if type(x) not in _PLAIN or type(weight) not in _PLAIN or (residual is not None and type(residual) not in _PLAIN):
        return None
    if not x.is_cuda:
        return None
    if x.dtype is not _BF16 or weight.dtype is not _BF16 or weight.dim() != 2 or x.dim() == 0:
        return None
    if bias is not None and (residual is not None or type(bias) not in _PLAIN):
        return None
    if _fwad._current_level >= 0:
        return None  # inside a forward-AD level a dual tensor's tangent must go through F.linear
    if torch.is_grad_enabled() and (
        x.requires_grad
        or weight.requires_grad
        or (residual is not None and residual.requires_grad)
        or (bias is not None and bias.requires_grad)
    ):
        return None
    n, k = weight.shape
    if k == 0 or x.shape[-1] != k:
        return None
    idx = x.get_device()
    if weight.get_device() != idx or not x.is_contiguous() or not weight.is_contiguous():
        return None
    # A negative-bit view shares its base's memory but means the negated values.
    px, pw = x.data_ptr(), weight.data_ptr()
    # 0: a ZeroTensor (no storage; F.linear knows it is zeros), never an address to hand a kernel
    if not px or not pw or (px | pw) & 15 or x.is_neg() or weight.is_neg():
        return None
    if residual is not None and (
        residual.dtype is not _BF16
        or residual.get_device() != idx
        or residual.shape != x.shape[:-1] + (n,)
        or not residual.is_contiguous()
        or residual.data_ptr() & 15
        or residual.is_neg()
    ):
        return None
    if bias is not None and (
        type(bias) not in _PLAIN
        or bias.dtype is not _BF16
        or bias.get_device() != idx
        or bias.shape != (n,)
        or not bias.is_contiguous()
        or bias.data_ptr() & 15
        or bias.is_neg()
    ):
        return None
    if not loader.STATE.loaded:
        loader.ensure_loaded()
    dev = loader.DEVICES.get(idx)
    if dev is None:
        return None
    table = dev.table if dev.table is not None else dev.bind()
    rec = table.get((n, k, x.numel() // k))
    if rec is None:
        return None
    if rec.variant.config.bias:
        return None if residual is not None else rec
    return None if bias is not None else rec


def run(x, weight, residual=None, bias=None):
    """Eager skinny_gemm.linear: the planned cubin when one fits exactly, else the fallback."""
    rec = plan(x, weight, residual, bias)
    if rec is None:
        return fallback(x, weight, bias, residual)
    out = x.new_empty(x.shape[:-1] + (rec.n,))
    idx = x.get_device()
    stream = _raw_stream(idx) if _raw_stream is not None else torch.cuda.current_stream(idx).cuda_stream
    # The 4th pointer: the bias on a bias variant, else the residual (0 = none).
    extra = bias if bias is not None else residual
    args = (rec, x.data_ptr(), weight.data_ptr(), out.data_ptr(), 0 if extra is None else extra.data_ptr(), stream)
    if _current_device() == idx:
        err = loader.launch_raw(*args)
    else:
        # The NULL stream means the current context's: make it this device's.
        with torch.cuda.device(idx):
            err = loader.launch_raw(*args)
    if int(err) != 0:
        try:
            _launch_failed(idx, rec, err)
        except Warning:  # -W error turned the one warning into an exception: still fall back
            pass
        return fallback(x, weight, bias, residual)
    return out


def _launch_failed(idx: int, rec: loader.Launch, err) -> None:
    """Drop a record the driver would not launch (warn once per variant and device); the caller falls back."""
    dev = loader.DEVICES[idx]
    with dev.lock:  # another thread's first call may be adding records to this table
        for key in [key for key, r in list(dev.table.bound.items()) if r is rec]:
            del dev.table[key]
    if (idx, rec.variant.id) not in _failed:
        _failed.add((idx, rec.variant.id))
        warnings.warn(
            f"skinny_gemm: the driver refused to launch {rec.variant.file} on GPU {idx} "
            f"({getattr(err, 'name', err)}); its shapes fall back to F.linear",
            loader.ArtifactWarning,
            stacklevel=4,
        )


def may_dispatch(x, weight, residual=None, bias=None) -> bool:
    """The checks that tracing can make (device, dtype, rank, autograd); the op decides the rest at run time."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return False  # F.linear raises its own error (or, for a non-tensor residual, adds it)
    if bias is not None and residual is not None:
        return False
    for extra in (residual, bias):
        if extra is not None and (
            not isinstance(extra, torch.Tensor) or extra.device.type != "cuda" or extra.dtype != _BF16
        ):
            return False
    if torch.is_grad_enabled() and (
        x.requires_grad
        or weight.requires_grad
        or (residual is not None and residual.requires_grad)
        or (bias is not None and bias.requires_grad)
    ):
        return False
    if _fwad._current_level >= 0:
        return False
    return x.device.type == "cuda" and x.dtype == _BF16 and weight.dtype == _BF16 and weight.dim() == 2 and x.dim() > 0


@torch.library.custom_op(
    "skinny_gemm::linear",
    mutates_args=(),
    schema="(Tensor x, Tensor weight, Tensor? residual=None, Tensor? bias=None) -> Tensor",
)
def linear_op(x, weight, residual=None, bias=None):
    """The opaque op: the same decision and launch as eager (run), made when the traced graph runs."""
    return run(x, weight, residual, bias)


@linear_op.register_fake
def _linear_fake(x, weight, residual=None, bias=None):
    return fallback(x, weight, bias, residual)


def tracing() -> bool:
    """True under torch.compile/export or an active torch function or dispatch mode: calls go through the op."""
    return (
        torch.compiler.is_compiling()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._len_torch_dispatch_stack() > 0
    )
