"""The custom op on CPU: schema and fake checked by opcheck, tracing routes through one opaque op
(fake CUDA tensors under FakeTensorMode work without a GPU), eager CPU calls never plan, and the eager
dispatch on a FakeDriver GPU: its launches, its fallbacks, and a "wgmma" record's weight tensor map."""

from __future__ import annotations

import operator
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from helpers.fake_capture import FakeCapture
from helpers.fake_driver import FakeDriver, R
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import skinny_gemm
from skinny_gemm.kernels.config import KernelConfig
from skinny_gemm.runtime import counters, loader, ops, tensormaps
from skinny_gemm.runtime import driver as driver_mod
from skinny_gemm.runtime.artifacts import ENV_ARTIFACTS
from skinny_gemm.runtime.devices import ArtifactWarning, DeviceTable, LaunchTable
from skinny_gemm.runtime.driver import Launch
from skinny_gemm.runtime.manifest import PARAMS, Variant

BF16 = torch.bfloat16


def test_opcheck():
    x, w = torch.randn(3, 64, dtype=BF16), torch.randn(32, 64, dtype=BF16)
    r = torch.randn(3, 32, dtype=BF16)
    b = torch.randn(32, dtype=BF16)
    for args in ((x, w, None), (x, w, r), (x[0], w, None), (x, w, None, b), (x[0], w, None, b)):
        torch.library.opcheck(torch.ops.skinny_gemm.linear.default, args)


def test_the_op_enters_no_torch_library_python():
    """The op a compiled graph calls runs its body without torch.library's Python around it, with or without
    inference mode: custom_op's wrapper cost 6-17 us a call more on the H200 (docs/perf.md, "The public op under
    torch.compile"), and vLLM's engine made custom_op's wrapper on the route's op cost some 200 us a call."""
    from pathlib import Path

    from helpers.profiling import entered

    x, w, b = torch.randn(3, 64, dtype=BF16), torch.randn(32, 64, dtype=BF16), torch.randn(32, dtype=BF16)
    runtime = Path(ops.__file__).resolve().parent

    def call(mode):
        with mode():  # inference mode, as vLLM serves, skips the autograd kernel
            return torch.ops.skinny_gemm.linear.default(x, w, None, b)  # what Inductor's code calls

    no_grad_first = ["_no_gradients", "wants_gradients", "linear_op"]
    for mode, first in ((torch.inference_mode, ["linear_op", "run"]), (torch.no_grad, no_grad_first)):
        y, entered_calls = entered(lambda: call(mode))
        torch.testing.assert_close(y, F.linear(x, w, b), rtol=0, atol=0)
        assert not [f for f, _ in entered_calls if "torch/_library" in f.as_posix()], (
            "the op's call enters torch.library"
        )
        assert [name for f, name in entered_calls if f.parent == runtime][: len(first)] == first


def test_the_op_refuses_calls_that_want_gradients():
    """No autograd formula: a call that wants gradients raises (skinny_gemm.linear gives such calls to F.linear),
    eagerly and when torch.compile builds the graph; without grad mode the same tensors run. (A reload keeps the
    op: tests/runtime/test_vllm_plugin.py, in a process of its own.)"""
    x, w = torch.randn(3, 64, dtype=BF16), torch.randn(32, 64, dtype=BF16, requires_grad=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        torch.ops.skinny_gemm.linear(x, w)
    compiled = torch.compile(lambda x, w: torch.ops.skinny_gemm.linear(x, w), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="no autograd formula"):
        compiled(x, w)
    with torch.no_grad():
        torch.testing.assert_close(torch.ops.skinny_gemm.linear(x, w), F.linear(x, w), rtol=0, atol=0)


def test_another_import_finding_the_op_warns_instead_of_failing():
    """A second copy of the module (its entries removed from sys.modules, imported again) finds the op registered:
    it keeps that registration and says so, where a second definition would fail the import."""
    with pytest.warns(RuntimeWarning, match="registered by another import"):
        assert ops._register() is None


def test_eager_is_not_tracing():
    assert not ops.tracing()


def test_plan_is_none_off_gpu():
    x, w = torch.randn(1, 64, dtype=BF16), torch.randn(32, 64, dtype=BF16)
    assert ops.plan(x, w) is None


class _TorchFunctionOnly(torch.nn.Parameter):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def test_storage_kind_is_the_one_rule_for_tensor_subclasses():
    """Tensors whose data pointer is their values: plain, Parameter, and subclasses that leave __torch_dispatch__
    alone (vLLM's parameter classes). Anything with its own __torch_dispatch__, and non-tensors, fall back."""
    from torch.testing._internal.two_tensor import TwoTensor

    w = torch.randn(4, 8, dtype=BF16)
    assert ops.storage_kind(w) and ops.storage_kind(torch.nn.Parameter(w, requires_grad=False))
    assert ops.storage_kind(_TorchFunctionOnly(w, requires_grad=False))
    assert not ops.storage_kind(TwoTensor(w, w.clone()))
    with FakeTensorMode() as mode:
        assert not ops.storage_kind(mode.from_tensor(w))
    assert not ops.storage_kind(3.0) and not ops.storage_kind([w])
    # The rule's effect: a TwoTensor weight goes to F.linear (which knows what it means), counted as "type".
    before = counters.FALLBACKS[(4, 8, 2, counters.TYPE)]
    ops.run(torch.randn(2, 8, dtype=BF16), TwoTensor(w, w))
    assert counters.FALLBACKS[(4, 8, 2, counters.TYPE)] == before + 1


def ops_in(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def fake_cuda(*shape, dtype=BF16, requires_grad=False):
    return torch.empty(shape, dtype=dtype, device="cuda", requires_grad=requires_grad)


def test_tracing_sees_one_opaque_op():
    with FakeTensorMode():
        x, w, r = fake_cuda(2, 3, 64), fake_cuda(32, 64), fake_cuda(2, 3, 32)
        gm = make_fx(lambda x, w, r: skinny_gemm.linear(x, w, residual=r))(x, w, r)
        y = skinny_gemm.linear(x, w, residual=r)
    assert ops_in(gm) == [torch.ops.skinny_gemm.linear.default]
    assert y.shape == (2, 3, 32) and y.dtype == BF16 and y.device.type == "cuda"


def test_fake_follows_f_linear_metadata():
    with FakeTensorMode():
        x, w = fake_cuda(5, 64), fake_cuda(32, 64)
        r = fake_cuda(32, dtype=torch.float32)  # not dispatchable: traced as F.linear + add
        assert skinny_gemm.linear(x, w, residual=r).dtype == torch.float32
        y = torch.ops.skinny_gemm.linear(x, w, fake_cuda(5, 32))
        assert y.shape == (5, 32) and y.is_contiguous()
        with pytest.raises(RuntimeError):
            torch.ops.skinny_gemm.linear(x, fake_cuda(32, 63), None)


def test_tracing_a_bias_sees_one_opaque_op():
    with FakeTensorMode():
        x, w, b = fake_cuda(2, 3, 64), fake_cuda(32, 64), fake_cuda(32)
        gm = make_fx(lambda x, w, b: skinny_gemm.linear(x, w, b))(x, w, b)
        y = skinny_gemm.linear(x, w, b)
    assert ops_in(gm) == [torch.ops.skinny_gemm.linear.default]
    assert y.shape == (2, 3, 32) and y.dtype == BF16


@pytest.mark.parametrize(
    "case",
    ["bias_and_residual", "fp32_bias", "fp16", "fp32_weight", "cpu", "weight_3d"],
)
def test_tracing_keeps_f_linear_where_no_plan_can_run(case):
    with FakeTensorMode():
        x, w, b, r = fake_cuda(2, 64), fake_cuda(32, 64), None, None
        if case == "bias_and_residual":
            b, r = fake_cuda(32), fake_cuda(2, 32)  # one extra pointer in the ABI: never both
        elif case == "fp32_bias":
            b = fake_cuda(32, dtype=torch.float32)
        elif case == "fp16":
            x, w = fake_cuda(2, 64, dtype=torch.float16), fake_cuda(32, 64, dtype=torch.float16)
        elif case == "fp32_weight":
            w = fake_cuda(32, 64, dtype=torch.float32)
        elif case == "cpu":
            x, w = torch.empty(2, 64, dtype=BF16), torch.empty(32, 64, dtype=BF16)
        elif case == "weight_3d":
            w = fake_cuda(1, 32, 64)

        def f(x, w, b, r):
            return skinny_gemm.linear(x, w, b, r)

        try:
            gm = make_fx(f)(x, w, b, r)
        except RuntimeError:
            assert case in ("fp32_weight", "weight_3d")  # F.linear's own error
            return
    assert torch.ops.skinny_gemm.linear.default not in ops_in(gm)


def test_autograd_keeps_f_linear():
    # (make_fx of a grad-requiring fake CUDA tensor aborts a CPU-only torch: check the decision itself)
    with FakeTensorMode():
        x, w = fake_cuda(2, 64), fake_cuda(32, 64, requires_grad=True)
        assert not ops.may_dispatch(x, w)
        assert not ops.may_dispatch(fake_cuda(2, 64, requires_grad=True), fake_cuda(32, 64))
        with torch.no_grad():
            assert ops.may_dispatch(x, w)


def test_no_grad_lets_a_grad_weight_through_the_op():
    with FakeTensorMode():
        x, w = fake_cuda(2, 64), fake_cuda(32, 64, requires_grad=True)
        with torch.no_grad():
            gm = make_fx(lambda x, w: skinny_gemm.linear(x, w))(x, w)
    assert ops_in(gm) == [torch.ops.skinny_gemm.linear.default]


class Proj(torch.nn.Module):
    def __init__(self, n, k, dtype):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, k, dtype=dtype), requires_grad=False)

    def forward(self, x, r):
        return skinny_gemm.linear(x, self.w, residual=r) * 2


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_compile_on_cpu_matches_eager(dtype):
    torch._dynamo.reset()
    mod = Proj(32, 64, dtype)
    x, r = torch.randn(3, 64, dtype=dtype), torch.randn(3, 32, dtype=dtype)
    compiled = torch.compile(mod, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x, r), (F.linear(x, mod.w) + r) * 2)


def test_compile_of_the_op_itself():
    torch._dynamo.reset()
    x, w, r = torch.randn(2, 64, dtype=BF16), torch.randn(32, 64, dtype=BF16), torch.randn(2, 32, dtype=BF16)
    f = torch.compile(lambda x, w, r: torch.ops.skinny_gemm.linear(x, w, r), backend="aot_eager", fullgraph=True)
    assert torch.equal(f(x, w, r), F.linear(x, w) + r)


class FakeCuda:
    """Just enough of a CUDA tensor for ops.run's decision and launch (no memory behind it)."""

    is_cuda = True
    requires_grad = False

    def __init__(self, shape, ptr, dtype=BF16, contiguous=True, neg=False):
        self.shape, self.ptr, self.dtype, self.contiguous, self.neg = torch.Size(shape), ptr, dtype, contiguous, neg

    def dim(self):
        return len(self.shape)

    def get_device(self):
        return 0

    def is_contiguous(self):
        return self.contiguous

    def data_ptr(self):
        return self.ptr

    def is_neg(self):
        return self.neg

    def numel(self):
        return self.shape.numel()

    def new_empty(self, shape):
        return FakeCuda(shape, 0x9000)


@pytest.fixture
def fake_dispatch(monkeypatch, fresh, art):
    """ops.run against a FakeDriver GPU, with FakeCuda tensors; returns (fake driver, fallback calls, a planned key)."""
    monkeypatch.setitem(ops._KINDS, FakeCuda, True)
    monkeypatch.setattr(ops, "_raw_stream", lambda idx: 1234)
    monkeypatch.setattr(ops, "_current_device", lambda: 0)
    fallbacks = []
    monkeypatch.setattr(ops, "fallback", lambda *args: fallbacks.append(args) or "fallback")
    monkeypatch.setattr(counters, "LAUNCHES", Counter())
    monkeypatch.setattr(counters, "FALLBACKS", Counter())
    fake = fresh()
    key = next(key for key, rec in sorted(loader.DEVICES[0].table.items()) if rec.variant.pdl and key[2] > 1)
    return fake, fallbacks, key


def test_eager_dispatch_launches_with_the_right_arguments(fake_dispatch):
    fake, fallbacks, (n, k, m) = fake_dispatch
    rec = loader.DEVICES[0].table[(n, k, m)]
    y = ops.run(FakeCuda((m, k), 0x1000), FakeCuda((n, k), 0x2000))
    assert fallbacks == [] and isinstance(y, FakeCuda) and y.shape == (m, n)
    launch = fake.launches[-1]
    assert (launch["a"], launch["w"], launch["out"], launch["residual"]) == (0x1000, 0x2000, 0x9000, 0)
    assert (launch["n"], launch["k"], launch["stream"], launch["grid"]) == (n, k, 1234, (rec.grid, 1, 1))
    assert launch["fn"] is rec.function
    ops.run(FakeCuda((1, m, k), 0x1100), FakeCuda((n, k), 0x2000), FakeCuda((1, m, n), 0x3000))
    assert fake.launches[-1]["residual"] == 0x3000 and fake.launches[-1]["a"] == 0x1100


@pytest.mark.parametrize(
    "case",
    [
        "misaligned x",
        "misaligned w",
        "strided x",
        "neg x",
        "fp16",
        "unplanned m",
        "residual shape",
        "residual misaligned",
        "zero-tensor x",
        "zero-tensor w",
        "forward AD",
    ],
)
def test_eager_dispatch_falls_back(fake_dispatch, case):
    """Each fallback is counted under its (N, K, M) and reason; the control launch under launches."""
    fake, fallbacks, (n, k, m) = fake_dispatch
    x, w, r = FakeCuda((m, k), 0x1000), FakeCuda((n, k), 0x2000), None
    if case == "misaligned x":
        x.ptr += 2
    elif case == "misaligned w":
        w.ptr += 8
    elif case == "strided x":
        x.contiguous = False
    elif case == "neg x":
        x.neg = True
    elif case == "fp16":
        x.dtype = w.dtype = torch.float16
    elif case == "unplanned m":
        x = FakeCuda((m + 64, k), 0x1000)
    elif case == "residual shape":
        r = FakeCuda((n,), 0x3000)
    elif case == "residual misaligned":
        r = FakeCuda((m, n), 0x3004)
    elif case == "zero-tensor x":
        x.ptr = 0  # a ZeroTensor has no storage: data_ptr() 0, aligned, contiguous
    elif case == "zero-tensor w":
        w.ptr = 0
    if case == "forward AD":
        from torch.autograd import forward_ad

        with forward_ad.dual_level():  # a dual tensor's tangent needs F.linear
            assert ops.run(x, w, r) == "fallback" and len(fallbacks) == 1 and fake.launches == []
    else:
        assert ops.run(x, w, r) == "fallback" and len(fallbacks) == 1 and fake.launches == []
    calls = m + 64 if case == "unplanned m" else m
    assert counters.snapshot() == {"launches": [], "fallbacks": [[n, k, calls, FALLBACK_REASON[case], 1]]}
    # the control: the same call with nothing wrong launches
    ok = ops.run(FakeCuda((m, k), 0x1000), FakeCuda((n, k), 0x2000), None)
    assert ok != "fallback" and len(fake.launches) == 1
    assert counters.snapshot()["launches"] == [[n, k, m, 1]]


FALLBACK_REASON = {
    "misaligned x": counters.ALIGNMENT,
    "misaligned w": counters.ALIGNMENT,
    "strided x": counters.CONTIGUITY,
    "neg x": counters.CONTIGUITY,
    "fp16": counters.DTYPE,
    "unplanned m": counters.NOT_PLANNED,
    "residual shape": counters.SHAPE,
    "residual misaligned": counters.ALIGNMENT,
    "zero-tensor x": counters.ALIGNMENT,
    "zero-tensor w": counters.ALIGNMENT,
    "forward AD": counters.AUTOGRAD,
}


def test_failed_launch_warns_once_and_falls_back(fake_dispatch, monkeypatch):
    fake, fallbacks, (n, k, m) = fake_dispatch
    monkeypatch.setattr(ops, "_failed", set())
    fake.cuLaunchKernelEx = lambda *a: (fake.CUresult.CUDA_ERROR_INVALID_HANDLE,)
    with pytest.warns(ArtifactWarning, match="CUDA_ERROR_INVALID_HANDLE"):
        assert ops.run(FakeCuda((m, k), 0x1000), FakeCuda((n, k), 0x2000)) == "fallback"
    assert (n, k, m) not in loader.DEVICES[0].table
    assert ops.run(FakeCuda((m, k), 0x1000), FakeCuda((n, k), 0x2000)) == "fallback"
    assert counters.snapshot() == {"launches": [], "fallbacks": [[n, k, m, counters.REFUSED, 2]]}


def test_failed_launch_under_warnings_as_errors_still_falls_back(fake_dispatch, monkeypatch):
    """python -W error: the one warning becomes an exception; the call must still return F.linear's result."""
    import warnings

    fake, fallbacks, (n, k, m) = fake_dispatch
    monkeypatch.setattr(ops, "_failed", set())
    fake.cuLaunchKernelEx = lambda *a: (fake.CUresult.CUDA_ERROR_INVALID_HANDLE,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ops.run(FakeCuda((m, k), 0x1000), FakeCuda((n, k), 0x2000)) == "fallback"
    assert len(fallbacks) == 1 and (n, k, m) not in loader.DEVICES[0].table


@pytest.fixture(scope="module")
def new_paths_built(tmp_path_factory):
    """The test-only variants (tests/helpers/new_paths.json) built for sm_90a: bias plans at (4096, 4096, 1/4)."""
    pytest.importorskip("cutlass", reason="building artifacts needs nvidia-cutlass-dsl")
    from helpers import new_paths

    root = tmp_path_factory.mktemp("new_paths")
    new_paths.build("sm_90a", root)
    return root


@pytest.fixture
def bias_dispatch(monkeypatch, fresh, new_paths_built):
    """ops.run against a FakeDriver H200 loaded with the new-path variants; returns (fake driver, fallback calls)."""
    monkeypatch.setenv(ENV_ARTIFACTS, str(new_paths_built))
    monkeypatch.setitem(ops._KINDS, FakeCuda, True)
    monkeypatch.setattr(ops, "_raw_stream", lambda idx: 1234)
    monkeypatch.setattr(ops, "_current_device", lambda: 0)
    fallbacks = []
    monkeypatch.setattr(ops, "fallback", lambda *args: fallbacks.append(args) or "fallback")
    fake = fresh()
    table = loader.DEVICES[0].table
    assert table[(4096, 4096, 1)].variant.config.bias and not table[(4096, 4096, 8)].variant.config.bias
    return fake, fallbacks


def test_bias_runs_a_bias_plan_with_the_bias_as_4th_pointer(bias_dispatch):
    fake, fallbacks = bias_dispatch
    x, w, b = FakeCuda((1, 4096), 0x1000), FakeCuda((4096, 4096), 0x2000), FakeCuda((4096,), 0x4000)
    rec = loader.DEVICES[0].table[(4096, 4096, 1)]
    y = skinny_gemm.linear(x, w, b)
    assert fallbacks == [] and isinstance(y, FakeCuda) and y.shape == (1, 4096)
    launch = fake.launches[-1]
    assert (launch["a"], launch["w"], launch["out"], launch["residual"]) == (0x1000, 0x2000, 0x9000, 0x4000)
    assert launch["fn"] is rec.function and launch["grid"] == (rec.grid, 1, 1)
    # a bias variant also serves a call with neither bias nor residual: the 4th pointer is 0
    ops.run(x, w)
    assert fake.launches[-1]["residual"] == 0 and len(fake.launches) == 2
    # the mma bias variant at M = 4
    ops.run(FakeCuda((4, 4096), 0x1000), w, None, b)
    assert fake.launches[-1]["residual"] == 0x4000
    assert fake.launches[-1]["fn"] is loader.DEVICES[0].table[(4096, 4096, 4)].function


@pytest.mark.parametrize(
    "case",
    [
        "residual on a bias plan",
        "bias and residual",
        "bias on a plain plan",
        "bias fp32",
        "bias shape",
        "bias 2-d",
        "bias misaligned",
        "bias strided",
        "bias neg",
        "bias grad",
        "bias not a tensor",
    ],
)
def test_bias_falls_back(bias_dispatch, case):
    fake, fallbacks = bias_dispatch
    m = 1
    x, w, b, r = FakeCuda((1, 4096), 0x1000), FakeCuda((4096, 4096), 0x2000), FakeCuda((4096,), 0x4000), None
    if case == "residual on a bias plan":
        b, r = None, FakeCuda((1, 4096), 0x3000)
    elif case == "bias and residual":
        r = FakeCuda((1, 4096), 0x3000)
    elif case == "bias on a plain plan":
        m = 8
        x = FakeCuda((8, 4096), 0x1000)
    elif case == "bias fp32":
        b.dtype = torch.float32
    elif case == "bias shape":
        b = FakeCuda((4097,), 0x4000)
    elif case == "bias 2-d":
        b = FakeCuda((1, 4096), 0x4000)
    elif case == "bias misaligned":
        b.ptr += 2
    elif case == "bias strided":
        b.contiguous = False
    elif case == "bias neg":
        b.neg = True
    elif case == "bias grad":
        b.requires_grad = True
    elif case == "bias not a tensor":
        b = [0.0] * 4096
    assert (4096, 4096, m) in loader.DEVICES[0].table
    assert ops.run(x, w, r, b) == "fallback" and fake.launches == []
    assert fallbacks == [(x, w, b, r)], "the fallback gets the bias and the residual"


class _Doubling(torch.Tensor):
    """A subclass whose active __torch_function__ changes what F.linear computes."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        return out * 2 if func is F.linear else out


class _BadPointer(torch.Tensor):
    """A subclass whose data_ptr raises: the dispatch must never ask it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.data_ptr:
            raise TypeError("no pointer here")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_active_torch_function_subclasses_get_f_linear_eagerly(monkeypatch):
    """Called eagerly with a subclass whose __torch_function__ is active, run gives exactly what F.linear gives
    (its result, its errors), counted as "type"; the same call with plain tensors launches (the control)."""
    from helpers import vllm_test_plans

    vllm_test_plans.cpu_as_gpu({(32, 64): (2,)}, monkeypatch)
    x, w = torch.randn(2, 64, dtype=BF16), torch.randn(32, 64, dtype=BF16)
    assert torch.equal(ops.run(x, w), F.linear(x, w)) and counters.snapshot()["launches"] == [[32, 64, 2, 1]]
    for cls in (_Doubling, _BadPointer):
        weight = w.as_subclass(cls)
        assert torch.equal(ops.run(x, weight), F.linear(x, weight)), cls
    assert torch.equal(ops.run(x, w.as_subclass(_Doubling)), 2 * F.linear(x, w))
    uninitialized = torch.nn.UninitializedParameter()
    with pytest.raises(ValueError) as ours:
        ops.run(x, uninitialized)
    with pytest.raises(ValueError) as theirs:
        F.linear(x, uninitialized)
    assert str(ours.value) == str(theirs.value)
    assert counters.snapshot() == {"launches": [[32, 64, 2, 1]], "fallbacks": [[32, 64, 2, counters.TYPE, 3]]}


# "wgmma" records (kernels/skinny_wgmma.py): the launch's 2nd pointer is the weight's tensor map in device memory
# (runtime/tensormaps.py). The records are made by hand (no wgmma cubin is built here): a real driver.Launch of
# each variant in a real DeviceTable, bound as a first call would bind it.
WGMMA = KernelConfig(m=8, kind="wgmma", threads=256, k_threads=256, cols=64, unroll=1, stages=8, prefetch=False)
MMA = KernelConfig(m=8, kind="mma", threads=256, k_threads=128, cols=16, unroll=1, stages=4, prefetch=False)
TMA_PLANS = {(4096, 4096, 8): WGMMA, (256, 512, 8): WGMMA, (2048, 2048, 8): MMA}
F_LINEAR = ops.fallback


def _variant(cfg: KernelConfig) -> Variant:
    shape = cfg.launch()
    return Variant(
        id=cfg.name,
        config=cfg,
        symbol=f"skinny_{cfg.name}",
        file=f"{cfg.name}.cubin",
        sha256="0" * 64,
        size=0,
        block=shape.block,
        cols_per_cta=cfg.cols_per_cta,
        cluster=shape.cluster,
        dynamic_smem=shape.smem,
        pdl=shape.pdl,
        params=PARAMS,
    )


@pytest.fixture
def tma_dispatch(monkeypatch):
    """ops.run against a FakeDriver H200 whose table plans TMA_PLANS, with FakeCuda tensors and no capture
    (``fake.capture``); returns (fake driver, fallback calls, (n, k, m) -> record)."""
    fake = FakeDriver()
    monkeypatch.setattr(driver_mod, "driver", fake)
    monkeypatch.setattr(loader, "STATE", loader.State(loaded=True))
    dev = DeviceTable(0, "Fake GPU", (9, 0), "sm_90a", None)
    dev.table = LaunchTable(dev, {key: cfg.name for key, cfg in TMA_PLANS.items()})
    records = {key: Launch(_variant(cfg), {"fn": cfg.name}, key[0], key[1]) for key, cfg in TMA_PLANS.items()}
    dev.table.bound.update(records)
    monkeypatch.setattr(loader, "DEVICES", {0: dev})
    monkeypatch.setattr(tensormaps, "_ARENAS", {})
    monkeypatch.setattr(ops, "_failed", set())
    monkeypatch.setitem(ops._KINDS, FakeCuda, True)
    monkeypatch.setattr(ops, "_raw_stream", lambda idx: 1234)
    monkeypatch.setattr(ops, "_current_device", lambda: 0)
    fallbacks = []
    monkeypatch.setattr(ops, "fallback", lambda *args: fallbacks.append(args) or "fallback")
    monkeypatch.setattr(counters, "LAUNCHES", Counter())
    monkeypatch.setattr(counters, "FALLBACKS", Counter())
    fake.capture = FakeCapture(monkeypatch)
    return fake, fallbacks, records


def test_a_wgmma_launch_passes_its_weights_tensor_map(tma_dispatch):
    fake, fallbacks, recs = tma_dispatch
    assert [rec.tma for rec in recs.values()] == [True, True, False]  # the records' flag: kind "wgmma"
    x, w = FakeCuda((8, 4096), 0x1000), FakeCuda((4096, 4096), 0x20000)
    y = ops.run(x, w)
    assert fallbacks == [] and isinstance(y, FakeCuda) and y.shape == (8, 4096)
    mapped = tensormaps.lookup(0, 0x20000, 4096, 4096, 64)
    launch = fake.launches[-1]
    assert launch["w"] == mapped and mapped not in (None, 0x20000)
    assert (launch["a"], launch["out"], launch["residual"], launch["n"], launch["k"]) == (0x1000, 0x9000, 0, 4096, 4096)
    assert launch["fn"] is recs[(4096, 4096, 8)].function and launch["smem"] == WGMMA.wgmma_smem
    # the map describes this weight: (K, N) innermost first, boxes of 64 x the variant's 64 rows; written on the
    # launch's stream before the launch
    enc = fake.encodes[-1]
    assert (enc["ptr"], enc["dims"], enc["strides"], enc["box"]) == (0x20000, [4096, 4096], [8192], [64, 64])
    assert [(c["dst"], c["stream"]) for c in fake.copies] == [(mapped, 1234)] and fake.syncs == [1234]
    # its next call: the same map, nothing encoded or copied; the residual is still the 4th pointer
    ops.run(FakeCuda((1, 8, 4096), 0x1100), w, FakeCuda((1, 8, 4096), 0x3000))
    assert (fake.launches[-1]["w"], fake.launches[-1]["residual"]) == (mapped, 0x3000) and len(fake.encodes) == 1
    # another weight of that shape: its own map, in the next slot
    ops.run(x, FakeCuda((4096, 4096), 0x40000))
    assert fake.launches[-1]["w"] == tensormaps.lookup(0, 0x40000, 4096, 4096, 64) == mapped + 128
    # the control: an mma record's 2nd pointer is its weight's, and it makes no map
    ops.run(FakeCuda((8, 2048), 0x1000), FakeCuda((2048, 2048), 0x60000))
    assert fake.launches[-1]["w"] == 0x60000 and fake.launches[-1]["fn"] is recs[(2048, 2048, 8)].function
    assert len(fake.encodes) == len(fake.copies) == 2 and tensormaps.count(0) == 2
    assert ops.plan(x, w) is recs[(4096, 4096, 8)] and len(fake.encodes) == 2
    assert counters.snapshot() == {"launches": [[2048, 2048, 8, 1], [4096, 4096, 8, 3]], "fallbacks": []}


def test_plan_makes_the_map_a_wgmma_call_needs(tma_dispatch):
    """ops.plan says what would run: a wgmma record with its weight's map, written then (as a call would)."""
    fake, fallbacks, recs = tma_dispatch
    x, w = FakeCuda((8, 4096), 0x1000), FakeCuda((4096, 4096), 0x20000)
    assert ops.plan(x, w) is recs[(4096, 4096, 8)] and tensormaps.lookup(0, 0x20000, 4096, 4096, 64) is not None
    ops.run(x, w)
    assert len(fake.encodes) == 1 and fake.launches[-1]["w"] == tensormaps.lookup(0, 0x20000, 4096, 4096, 64)


def test_a_new_wgmma_weight_inside_a_capture_is_deferred(tma_dispatch):
    """vLLM's eager warm-up maps its weights; inside the capture that follows they launch with their maps, and a
    weight never called before falls back (counted as a capture deferral) with nothing encoded or copied."""
    fake, fallbacks, recs = tma_dispatch
    x, w, new = FakeCuda((8, 4096), 0x1000), FakeCuda((4096, 4096), 0x20000), FakeCuda((4096, 4096), 0x40000)
    ops.run(x, w)
    mapped, calls = fake.launches[-1]["w"], len(fake.calls)
    fake.capture.capturing = {0}
    assert ops.run(x, w) is not fallbacks and fake.launches[-1]["w"] == mapped and len(fake.launches) == 2
    assert ops.run(x, new) == "fallback" and fallbacks == [(x, new, None, None)]
    assert ops.decide(x, new) == counters.DEFERRED and ops.plan(x, new) is None
    assert fake.calls[calls:] == [] and len(fake.encodes) == len(fake.copies) == 1 and len(fake.launches) == 2
    assert counters.snapshot() == {
        "launches": [[4096, 4096, 8, 2]],
        "fallbacks": [[4096, 4096, 8, counters.DEFERRED, 1]],
    }
    fake.capture.capturing = set()  # the control: out of the capture the new weight gets its map and launches
    ops.run(x, new)
    assert fake.launches[-1]["w"] == tensormaps.lookup(0, 0x40000, 4096, 4096, 64) == mapped + 128


def test_bench_and_tuning_launches_of_a_wgmma_variant_pass_its_map(tma_dispatch, monkeypatch):
    """DeviceTable.launch (bench and tuner code): a wgmma variant gets its weight's map as the 2nd pointer, an mma one
    its weight; a weight first launched inside a capture has no map to write there, so the launch stops with one line."""
    import contextlib

    fake, _, recs = tma_dispatch
    dev = loader.DEVICES[0]
    by_id = {rec.variant.id: rec for rec in recs.values()}
    monkeypatch.setattr(dev, "launch_for", lambda vid, n, k: by_id[vid])
    monkeypatch.setattr(torch.cuda, "device", lambda idx: contextlib.nullcontext())
    dev.launch(WGMMA.name, 0x1000, 0x20000, 0x9000, None, 4096, 4096, stream=77)
    mapped = tensormaps.lookup(0, 0x20000, 4096, 4096, 64)
    assert fake.launches[-1]["w"] == mapped and mapped not in (None, 0x20000) and fake.syncs == [77]
    dev.launch(MMA.name, 0x1000, 0x60000, 0x9000, None, 2048, 2048, stream=77)
    assert fake.launches[-1]["w"] == 0x60000
    fake.capture.capturing = {0}
    dev.launch(WGMMA.name, 0x1000, 0x20000, 0x9000, None, 4096, 4096, stream=77)  # mapped before: launches
    assert fake.launches[-1]["w"] == mapped
    with pytest.raises(RuntimeError, match="inside a graph capture"):
        dev.launch(WGMMA.name, 0x1000, 0x40000, 0x9000, None, 4096, 4096, stream=77)
    assert len(fake.encodes) == 1
    # the stream given captures while torch's current one does not: the same one line, nothing written
    fake.capture.capturing, fake.capturing_streams = set(), {77}
    with pytest.raises(RuntimeError, match="inside a graph capture"):
        dev.launch(WGMMA.name, 0x1000, 0x40000, 0x9000, None, 4096, 4096, stream=77)
    assert len(fake.encodes) == 1 and fake.syncs == [77]
    fake.capturing_streams = set()  # the control: once that capture ends, the weight gets its map
    dev.launch(WGMMA.name, 0x1000, 0x40000, 0x9000, None, 4096, 4096, stream=77)
    assert fake.launches[-1]["w"] == tensormaps.lookup(0, 0x40000, 4096, 4096, 64) == mapped + 128


@pytest.mark.parametrize("why", ["encode fails", "alloc fails", "cap reached", "binding raises"])
def test_a_refused_tensor_map_warns_once_and_falls_back(tma_dispatch, monkeypatch, why):
    import warnings

    fake, fallbacks, recs = tma_dispatch
    x, w, w2 = FakeCuda((8, 4096), 0x1000), FakeCuda((4096, 4096), 0x20000), FakeCuda((4096, 4096), 0x40000)
    if why == "cap reached":
        monkeypatch.setattr(tensormaps, "MAX_MAPS", 1)
        ops.run(x, FakeCuda((4096, 4096), 0x80000))  # the one map the device may hold
    elif why == "encode fails":
        fake.fail["cuTensorMapEncodeTiled"] = R.CUDA_ERROR_INVALID_VALUE
    elif why == "binding raises":  # not a DriverError: still a fallback, never an exception out of run()

        def broken(*args):
            fake.encodes.append({"ptr": int(args[2])})
            raise OverflowError("int too big to convert")

        fake.cuTensorMapEncodeTiled = broken
    else:
        fake.fail["cuMemAlloc"] = R.CUDA_ERROR_OUT_OF_MEMORY
    launched = len(fake.launches)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for weight in (w, w, w2):
            assert ops.run(x, weight) == "fallback"
        assert ops.plan(x, w) is None and ops.decide(x, w2) == counters.REFUSED
    assert [w.category for w in caught] == [ArtifactWarning], [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert recs[(4096, 4096, 8)].variant.file in message and "GPU 0" in message
    expected = {
        "encode fails": "cuTensorMapEncodeTiled",
        "alloc fails": "cuMemAlloc",
        "cap reached": "holds 1 ",
        "binding raises": "OverflowError: int too big",
    }
    assert expected[why] in message, message
    assert fallbacks == [(x, w, None, None), (x, w, None, None), (x, w2, None, None)]
    assert len(fake.launches) == launched and counters.FALLBACKS[(4096, 4096, 8, counters.REFUSED)] == 3
    # the driver was asked once per weight: a refused weight is not retried on every call
    if why in ("encode fails", "binding raises"):
        assert [e["ptr"] for e in fake.encodes] == [0x20000, 0x40000]
    # the control: the mma record still launches (and, at the cap, the mapped weight too)
    ops.run(FakeCuda((8, 2048), 0x1000), FakeCuda((2048, 2048), 0x60000))
    assert fake.launches[-1]["w"] == 0x60000
    if why == "cap reached":
        ops.run(x, FakeCuda((4096, 4096), 0x80000))
        assert fake.launches[-1]["w"] == tensormaps.lookup(0, 0x80000, 4096, 4096, 64)


def test_a_refused_tensor_map_under_warnings_as_errors_still_falls_back(tma_dispatch):
    import warnings

    fake, fallbacks, recs = tma_dispatch
    fake.fail["cuTensorMapEncodeTiled"] = R.CUDA_ERROR_INVALID_VALUE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ops.run(FakeCuda((8, 4096), 0x1000), FakeCuda((4096, 4096), 0x20000)) == "fallback"
    assert len(fallbacks) == 1 and fake.launches == []


def test_a_refused_tensor_map_gives_f_linears_result(tma_dispatch, monkeypatch):
    """Real CPU tensors through the real fallback: the encode (of this weight's pointer) fails, F.linear runs."""
    fake, fallbacks, recs = tma_dispatch
    monkeypatch.setattr(ops, "fallback", F_LINEAR)
    monkeypatch.setattr(ops, "_on_gpu", operator.attrgetter("is_cpu"))
    monkeypatch.setitem(loader.DEVICES, -1, loader.DEVICES[0])  # a CPU tensor's get_device() stands for GPU 0

    def cuDeviceGet(ordinal):
        return (R.CUDA_SUCCESS, 0)

    fake.cuDeviceGet = cuDeviceGet
    fake.fail["cuTensorMapEncodeTiled"] = R.CUDA_ERROR_INVALID_VALUE
    x, w = torch.randn(8, 512, dtype=BF16), torch.randn(256, 512, dtype=BF16)
    with pytest.warns(ArtifactWarning, match="cuTensorMapEncodeTiled"):
        y = ops.run(x, w)
    assert torch.equal(y, F.linear(x, w)) and fake.launches == []
    assert fake.encodes[-1]["ptr"] == w.data_ptr() and fake.encodes[-1]["dims"] == [512, 256]
    assert counters.snapshot() == {"launches": [], "fallbacks": [[256, 512, 8, counters.REFUSED, 1]]}


RING = KernelConfig(
    m=12, kind="mma", threads=256, k_threads=256, cols=8, stages=4, fetch=0, unroll=1, prefetch=False, ring=True
)


@pytest.mark.parametrize(
    "cfg, static, opt_in",
    [
        (MMA, 5120, None),  # no dynamic shared memory: nothing to opt into
        (RING, 0, None),  # a 48 KB ring alone fits the default
        (RING, 5120, RING.ring_smem),  # 48 KB ring + static reduction buffers: past 48 KB (the H200 refused it)
        (WGMMA, 0, WGMMA.wgmma_smem),
    ],
)
def test_bind_opts_into_shared_memory_past_48_kb(monkeypatch, cfg, static, opt_in):
    """Binding sets the kernel's dynamic shared-memory limit whenever static + dynamic passes 48 KB."""
    from skinny_gemm.runtime import devices

    fake = FakeDriver()
    monkeypatch.setattr(driver_mod, "driver", fake)
    attrs = fake.CUfunction_attribute
    fake.func_attrs[attrs.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES] = static
    fake.ctx_stack.append(1)
    kernel = devices.Kernel(_variant(cfg), None, {"symbol": cfg.symbol, "params": [(o, s) for _, o, s in PARAMS]})
    devices._function(kernel)
    assert RING.ring_smem == 48 * 1024
    want = [] if opt_in is None else [(attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, opt_in)]
    assert fake.func_sets == want
