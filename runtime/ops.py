"""The torch side: the dispatch decision, the launch on torch's current stream, and the ``skinny_gemm::linear`` op.

Eager calls go straight to ``run`` (no dispatcher round trip: the host cost of
one call is the point on short GEMMs); graph capture records that launch like
any other. Under torch.compile, export or a dispatch mode, calls go through the
op, whose fake runs F.linear on fake tensors, so tracing sees one opaque
op with F.linear's output metadata and errors.
"""

import operator
import warnings

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad as _fwad

from . import counters, devices, driver, loader, tensormaps

_BF16 = torch.bfloat16
# The one rule for which tensors a kernel may read (storage_kind, cached per class):
# torch.Tensor, torch.nn.Parameter, and any subclass that leaves __torch_dispatch__
# alone, while its __torch_function__ is not active. Such a subclass (vLLM's
# BasevLLMParameter family, which overrides only __torch_function__; inside a
# custom op, where torch.compile with Inductor hands vLLM's class over, torch has
# switched subclass __torch_function__ off) is a tensor with its own storage. An
# active __torch_function__ may change what F.linear computes, and a class with its
# own __torch_dispatch__ (FakeTensor, FunctionalTensor, DTensor, any wrapper
# subclass) may have no data or data that means something else: F.linear knows how
# to treat both.
_KINDS: dict = {torch.Tensor: True, torch.nn.Parameter: True}
_has_torch_function = torch._C._has_torch_function
_NO_DISPATCH = torch.Tensor.__torch_dispatch__
# The raw calls behind torch.cuda.current_stream / current_device, without their Python wrappers.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
# Whether a tensor lives where the kernels run (the CPU engine tests point it at CPU tensors).
_on_gpu = operator.attrgetter("is_cuda")
_failed: set = set()


def storage_kind(t) -> bool:
    """True when ``t``'s data pointer is its values (the rule above); the dispatch path reads only such tensors."""
    cls = type(t)
    ok = _KINDS.get(cls)
    if ok is None:
        ok = _KINDS[cls] = issubclass(cls, torch.Tensor) and cls.__torch_dispatch__ is _NO_DISPATCH
    return ok


def wants_gradients(x, weight, residual=None, bias=None) -> bool:
    """True when grad mode is on and a tensor of the call requires grad: the op has no autograd formula, so such a
    call is F.linear's (the dispatch, its tracing check, the op's autograd kernel and the vLLM route ask this)."""
    return torch.is_grad_enabled() and (
        x.requires_grad
        or weight.requires_grad
        or (residual is not None and residual.requires_grad)
        or (bias is not None and bias.requires_grad)
    )


def fallback(x, weight, bias=None, residual=None):
    """F.linear(x, weight, bias) (+ residual): the reference result and the reference errors."""
    y = F.linear(x, weight, bias)
    return y if residual is None else y + residual


def plan(x, weight, residual=None, bias=None) -> driver.Launch | None:
    """The launch record that would run for these eager tensors, or None (then F.linear runs).

    A bias runs only on a bias variant (whose 4th pointer is the bias); a residual only on a
    variant without bias; both at once always fall back (the 40-byte ABI has one extra pointer).
    A "wgmma" record runs only with its weight's tensor map, which this writes if need be (as a call would).
    """
    rec = decide(x, weight, residual, bias)
    return None if isinstance(rec, str) else rec


def decide(x, weight, residual=None, bias=None):
    """The launch record for these eager tensors, or the reason (runtime/counters.py) why F.linear runs."""
    rec = _decide(x, weight, residual, bias)
    if not isinstance(rec, str) and rec.tma:
        found = _weight_map(rec, x.get_device(), weight.data_ptr())
        if isinstance(found, str):
            return found
    return rec


def _decide(x, weight, residual, bias):
    """``decide`` short of a "wgmma" record's tensor map (``run`` looks that up once, for its launch)."""
    try:
        return _plan(x, weight, residual, bias)
    except driver.DriverError:  # loading or binding the variant failed (it is refused, warned once)
        return counters.REFUSED
    except (RuntimeError, NotImplementedError, TypeError, ValueError):  # sparse, nested, mkldnn...: F.linear's
        return counters.TYPE
    except Warning:  # a refusal warned under -W error: the variant is already refused, the call falls back
        return counters.REFUSED


def _plan(x, weight, residual, bias):
    if not storage_kind(x) or not storage_kind(weight) or (residual is not None and not storage_kind(residual)):
        return counters.TYPE
    if (bias is not None and not storage_kind(bias)) or _has_torch_function((x, weight, residual, bias)):
        return counters.TYPE
    if not _on_gpu(x):
        return counters.DEVICE
    if x.dtype is not _BF16 or weight.dtype is not _BF16:
        return counters.DTYPE
    if weight.dim() != 2 or x.dim() == 0:
        return counters.SHAPE
    if bias is not None and residual is not None:
        return counters.EXTRA
    if _fwad._current_level >= 0:
        return counters.AUTOGRAD  # inside a forward-AD level a dual tensor's tangent must go through F.linear
    if wants_gradients(x, weight, residual, bias):
        return counters.AUTOGRAD
    n, k = weight.shape
    if k == 0 or x.shape[-1] != k:
        return counters.SHAPE
    idx = x.get_device()
    if weight.get_device() != idx:
        return counters.DEVICE
    # A negative-bit view shares its base's memory but means the negated values.
    if not x.is_contiguous() or not weight.is_contiguous() or x.is_neg() or weight.is_neg():
        return counters.CONTIGUITY
    px, pw = x.data_ptr(), weight.data_ptr()
    # 0: a ZeroTensor (no storage; F.linear knows it is zeros), never an address to hand a kernel
    if not px or not pw or (px | pw) & 15:
        return counters.ALIGNMENT
    for extra in (residual, bias):
        if extra is None:
            continue
        if extra.dtype is not _BF16:
            return counters.DTYPE
        if extra.get_device() != idx:
            return counters.DEVICE
        if extra.shape != ((n,) if extra is bias else x.shape[:-1] + (n,)):
            return counters.SHAPE
        if not extra.is_contiguous() or extra.is_neg():
            return counters.CONTIGUITY
        if extra.data_ptr() & 15:
            return counters.ALIGNMENT
    if not loader.STATE.loaded:
        loader.ensure_loaded()
    dev = loader.DEVICES.get(idx)
    if dev is None:
        return counters.NO_KERNELS
    table = dev.table if dev.table is not None else dev.bind()
    key = (n, k, x.numel() // k)
    rec = table.get(key)
    if rec is None:
        return _miss(dev, table, key)
    if rec.variant.config.bias:
        return counters.EXTRA if residual is not None else rec
    return counters.EXTRA if bias is not None else rec


def _weight_map(rec, idx: int, pw: int):
    """The device address of the tensor map of the weight at ``pw`` for "wgmma" record ``rec`` (written on its first
    call outside a graph capture), or why F.linear runs: a capture defers a new weight, the cap or the driver refuses.
    """
    rows = rec.variant.config.cols
    found = tensormaps.lookup(idx, pw, rec.n, rec.k, rows)
    if found is not None:
        return found
    try:
        found = tensormaps.weight_map(idx, pw, rec.n, rec.k, rows, _stream(idx))
    except Exception as exc:  # the cap, the driver, or its binding refused: never a crash on valid input
        try:
            _map_refused(idx, rec, exc)
        except Warning:  # -W error turned the one warning into an exception: still fall back
            pass
        return counters.REFUSED
    return counters.DEFERRED if found is None else found


def _map_refused(idx: int, rec: driver.Launch, exc: Exception) -> None:
    """Warn once per variant and device (once per device at the cap) that a weight got no tensor map."""
    full = isinstance(exc, tensormaps.MapsFull)
    once = (idx, "tensor maps full") if full else (idx, rec.variant.id, "tensor map")
    if once not in _failed:
        _failed.add(once)
        warnings.warn(
            f"skinny_gemm: no tensor map for a weight of {rec.variant.file} on GPU {idx} ({tensormaps.refusal(exc)}); "
            f"{'new weights' if full else 'such weights'} fall back to F.linear",
            devices.ArtifactWarning,
            stacklevel=5,
        )


def _miss(dev, table, key) -> str:
    """Why a key has no record: still planned (a capture deferred its binding), refused, or never planned."""
    if key in table:
        return counters.DEFERRED
    if dev.library is None or dev.library.manifest is None:
        return counters.NO_KERNELS
    return counters.REFUSED if key in dev.library.manifest.plans else counters.NOT_PLANNED


def _key(x, weight) -> tuple:
    """(N, K, M) of a call for the counters; (0, 0, 0) where the arguments have none."""
    try:
        n, k = weight.shape
        return (n, k, x.numel() // k) if k else (n, k, 0)
    except (AttributeError, TypeError, ValueError, RuntimeError, NotImplementedError):
        return (0, 0, 0)


def run(x, weight, residual=None, bias=None):
    """Eager skinny_gemm.linear: the planned cubin when one fits exactly, else the fallback; both counted."""
    rec = _decide(x, weight, residual, bias)
    if isinstance(rec, str):
        return _fall_back(x, weight, bias, residual, rec)
    idx = x.get_device()
    w = weight.data_ptr()
    if rec.tma:  # "wgmma": the 2nd pointer is the weight's tensor map (runtime/tensormaps.py)
        w = _weight_map(rec, idx, w)
        if isinstance(w, str):
            return _fall_back(x, weight, bias, residual, w)
    out = x.new_empty(x.shape[:-1] + (rec.n,))
    # The 4th pointer: the bias on a bias variant, else the residual (0 = none).
    extra = bias if bias is not None else residual
    err = _launch(rec, idx, x.data_ptr(), w, out.data_ptr(), 0 if extra is None else extra.data_ptr())
    key = (rec.n, rec.k, out.numel() // rec.n)
    if int(err) != 0:
        try:
            _launch_failed(idx, rec, err)
        except Warning:  # -W error turned the one warning into an exception: still fall back
            pass
        y = fallback(x, weight, bias, residual)
        counters.FALLBACKS[(*key, counters.REFUSED)] += 1
        return y
    counters.LAUNCHES[key] += 1
    return out


def _fall_back(x, weight, bias, residual, reason: str):
    y = fallback(x, weight, bias, residual)
    # Counted once F.linear has run: a call that raises F.linear's error is no fallback.
    counters.FALLBACKS[(*_key(x, weight), reason)] += 1
    return y


def _stream(idx: int) -> int:
    """Torch's current stream on GPU ``idx``: its raw handle."""
    return _raw_stream(idx) if _raw_stream is not None else torch.cuda.current_stream(idx).cuda_stream


def _launch(rec, idx: int, a: int, w: int, out: int, extra: int):
    """Hand the launch to the driver on torch's current stream of GPU ``idx``; its CUresult (0: launched).

    Every dispatch check has passed here: this is the one call a CPU test replaces with a fake launch.
    """
    stream = _raw_stream(idx) if _raw_stream is not None else torch.cuda.current_stream(idx).cuda_stream
    if _current_device() == idx:
        return driver.launch_raw(rec, a, w, out, extra, stream)
    # The NULL stream means the current context's: make it this device's.
    with torch.cuda.device(idx):
        return driver.launch_raw(rec, a, w, out, extra, stream)


def _launch_failed(idx: int, rec: driver.Launch, err) -> None:
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
            devices.ArtifactWarning,
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
    if wants_gradients(x, weight, residual, bias):
        return False
    if _fwad._current_level >= 0:
        return False
    return x.device.type == "cuda" and x.dtype == _BF16 and weight.dtype == _BF16 and weight.dim() == 2 and x.dim() > 0


def linear_op(x, weight, residual=None, bias=None):
    """The opaque op: the same decision and launch as eager (run), made when the traced graph runs."""
    return run(x, weight, residual, bias)


def _linear_fake(x, weight, residual=None, bias=None):
    return fallback(x, weight, bias, residual)


def _no_gradients(x, weight, residual=None, bias=None):
    """The op's autograd kernel: a call that wants gradients is refused (the op has no formula; skinny_gemm.linear
    never sends one: may_dispatch), any other goes below autograd to ``linear_op``. Outside inference mode it
    costs a call about 2.6 us on the CPU machine, where torch.library.register_autograd's kernel cost 5 us
    (docs/decisions.md); inference mode, where vLLM serves, skips it."""
    if wants_gradients(x, weight, residual, bias):
        raise RuntimeError(
            "skinny_gemm::linear has no autograd formula: call skinny_gemm.linear, which gives calls that want "
            "gradients to F.linear"
        )
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.skinny_gemm.linear.default(x, weight, residual, bias)


def registered_elsewhere(namespace: str, name: str, stacklevel: int) -> bool:
    """True, with a warning, where op ``namespace::name`` exists before this module registers it: another import of
    skinny_gemm (its entries removed from sys.modules and imported again) holds it, and that import's code runs
    its calls. A second definition would fail instead."""
    if not hasattr(getattr(torch.ops, namespace), name):
        return False
    warnings.warn(
        f"skinny_gemm: {namespace}::{name} is registered by another import of skinny_gemm; its calls run that "
        "import's code",
        RuntimeWarning,
        stacklevel=stacklevel,
    )
    return True


def _register() -> "torch.library.Library | None":
    """Define ``skinny_gemm::linear`` through torch.library.Library, as vLLM registers its ops, not
    torch.library.custom_op: inside a compiled graph on the H200 custom_op's per-call Python wrapper cost 6-17 us
    more than this (docs/perf.md, "The public op under torch.compile"). CompositeExplicitAutograd: every device, as
    custom_op registered it; the autograd kernel ``_no_gradients`` refuses calls that want gradients, where
    custom_op's raised at their backward. None where the op exists already: registered by another import of this
    module (its entries removed from sys.modules and imported again), whose code then runs the op's calls; that is
    warned."""
    if registered_elsewhere("skinny_gemm", "linear", stacklevel=3):
        return None
    lib = torch.library.Library("skinny_gemm", "FRAGMENT")
    lib.define(
        "linear(Tensor x, Tensor weight, Tensor? residual=None, Tensor? bias=None) -> Tensor",
        tags=(torch.Tag.pt2_compliant_tag,),
    )
    lib.impl("linear", linear_op, "CompositeExplicitAutograd")
    lib.impl("linear", _no_gradients, "Autograd")
    torch.library.register_fake("skinny_gemm::linear", _linear_fake, lib=lib)
    return lib


# The op lives as long as this module; a reload keeps the Library it made first (dropping it would drop the op).
_LIB = globals().get("_LIB") or _register()


def tracing() -> bool:
    """True under torch.compile/export or an active torch function or dispatch mode: calls go through the op."""
    return (
        torch.compiler.is_compiling()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._len_torch_dispatch_stack() > 0
    )
