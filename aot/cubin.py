"""Read what a cubin says about itself (pyelftools; no CUDA, no cutlass): arch, symbols, param layout."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

EM_CUDA = 190
# .nv.info attribute ids (EIATTR_*) and .nv.compat ids (EICOMPAT_ATTR_*), as cuobjdump names them.
EIATTR_KPARAM_INFO = 0x17
EIATTR_REQNTID = 0x10
EIATTR_REGCOUNT = 0x2F
EICOMPAT_ACCELERATOR_TARGET = 0x09  # 1 for arch-specific ("a") targets: sm_90a vs sm_90
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4


class CubinError(ValueError):
    """Not a readable CUDA cubin."""


@dataclass
class KernelInfo:
    """One kernel symbol's records: params as (ordinal, offset, size), launch block, registers."""

    params: list[tuple[int, int, int]] = field(default_factory=list)
    reqntid: tuple[int, ...] | None = None
    registers: int | None = None


@dataclass
class CubinInfo:
    """What verify needs from a cubin."""

    arch: str
    toolkit: str
    kernels: dict[str, KernelInfo]


def _attributes(data: bytes):
    """Yield (format, attribute, payload) from an .nv.info / .nv.compat blob."""
    pos = 0
    while pos + 2 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        if fmt == EIFMT_NVAL:
            yield fmt, attr, b""
            pos += 2
        elif fmt in (EIFMT_BVAL, EIFMT_HVAL):
            yield fmt, attr, data[pos + 2 : pos + 4]
            pos += 4
        elif fmt == EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, pos + 2)
            yield fmt, attr, data[pos + 4 : pos + 4 + size]
            pos += 4 + size
        else:
            raise CubinError(f"unknown .nv.info format byte {fmt:#x}")


def inspect(blob: bytes) -> CubinInfo:
    """Parse a cubin; raises CubinError if it is not one."""
    try:
        elf = ELFFile(io.BytesIO(blob))
        if elf.header["e_machine"] not in ("EM_CUDA", EM_CUDA):
            raise CubinError(f"ELF machine is {elf.header['e_machine']}, not EM_CUDA")
        sm = (elf.header["e_flags"] >> 8) & 0xFF
        accel = False
        compat = elf.get_section_by_name(".nv.compat")
        if compat is not None:
            for fmt, attr, payload in _attributes(compat.data()):
                if attr == EICOMPAT_ACCELERATOR_TARGET and fmt == EIFMT_BVAL:
                    accel = payload[0] == 1
        toolkit = ""
        note = elf.get_section_by_name(".note.nv.tkinfo")
        if note is not None:
            text = note.data().decode("latin-1")
            marker = "Cuda compilation tools, "
            if marker in text:
                toolkit = text[text.index(marker) :].split("\x00")[0]
        kernels: dict[str, KernelInfo] = {}
        for section in elf.iter_sections():
            if section.name.startswith(".text."):
                kernels.setdefault(section.name[len(".text.") :], KernelInfo())
        for name, info in kernels.items():
            sec = elf.get_section_by_name(f".nv.info.{name}")
            if sec is None:
                continue
            for fmt, attr, payload in _attributes(sec.data()):
                if attr == EIATTR_KPARAM_INFO and fmt == EIFMT_SVAL:
                    _, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
                    info.params.append((ordinal, offset, (flags >> 18) & 0x3FFF))
                elif attr == EIATTR_REQNTID and fmt == EIFMT_SVAL:
                    info.reqntid = struct.unpack_from(f"<{len(payload) // 4}I", payload)
            info.params.sort()
        general = elf.get_section_by_name(".nv.info")
        if general is not None:
            symtab = elf.get_section_by_name(".symtab")
            for fmt, attr, payload in _attributes(general.data()):
                if attr == EIATTR_REGCOUNT and fmt == EIFMT_SVAL and symtab is not None:
                    index, regs = struct.unpack_from("<II", payload)
                    sym = symtab.get_symbol(index).name
                    if sym in kernels:
                        kernels[sym].registers = regs
    except (ELFError, struct.error, IndexError) as exc:
        raise CubinError(f"not a valid cubin: {exc}") from None
    return CubinInfo(arch=f"sm_{sm}{'a' if accel else ''}", toolkit=toolkit, kernels=kernels)
