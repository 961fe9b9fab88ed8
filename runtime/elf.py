"""The one cubin reader (no CUDA, no cutlass, no pyelftools): ELF arch, kernel symbols, parameter layout,
static shared memory.

The runtime reads every cubin with it before ``cuLibraryLoadData``; verify and
the build read them with it too. Every table and section must lie inside the
blob: the driver was seen to crash the process (SIGSEGV, H200, driver 580) on a
cubin cut short, so a damaged one must be refused here, never handed on.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

EM_CUDA = 190
SHT_SYMTAB, SHT_NOBITS = 2, 8
SECTION_HEADER_BYTES, SYMBOL_BYTES = 64, 24
# .nv.info attribute ids (EIATTR_*) and .nv.compat ids (EICOMPAT_ATTR_*), as cuobjdump names them.
EIATTR_KPARAM_INFO = 0x17
EIATTR_REQNTID = 0x10
EIATTR_REGCOUNT = 0x2F
EICOMPAT_ACCELERATOR_TARGET = 0x09  # 1 for arch-specific ("a") targets: sm_90a vs sm_90
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
TOOLKIT_MARKER = "Cuda compilation tools, "


class CubinError(ValueError):
    """Not a readable CUDA cubin; the message says what is wrong."""


@dataclass
class KernelInfo:
    """One kernel symbol's records: params as (ordinal, offset, size), launch block, registers."""

    params: list[tuple[int, int, int]] = field(default_factory=list)
    reqntid: tuple[int, ...] | None = None
    registers: int | None = None
    # static shared-memory bytes (the size of its .nv.shared.<symbol> section; 0 without one)
    shared: int = 0


@dataclass
class CubinInfo:
    """What a cubin says about itself: target (``sm_90a``), toolkit line, kernels by symbol."""

    arch: str
    toolkit: str
    kernels: dict[str, KernelInfo]


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int


def _sections(blob: bytes) -> list[Section]:
    """The section table, every entry bounds-checked; raises CubinError."""
    if len(blob) < 64 or blob[:4] != b"\x7fELF":
        raise CubinError("not an ELF file")
    if blob[4] != 2 or blob[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF file")
    machine = int.from_bytes(blob[18:20], "little")
    if machine != EM_CUDA:
        raise CubinError(f"ELF machine is {machine}, not EM_CUDA ({EM_CUDA})")
    phoff, shoff = struct.unpack_from("<QQ", blob, 32)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", blob, 54)
    if phoff + phentsize * phnum > len(blob) or shoff + shentsize * shnum > len(blob):
        raise CubinError("ELF header tables lie outside the file (truncated?)")
    if shentsize < SECTION_HEADER_BYTES or shnum == 0 or shstrndx >= shnum:
        raise CubinError("ELF section table is malformed")
    raw = []
    for i in range(shnum):
        name, stype, _, _, offset, size, link = struct.unpack_from("<IIQQQQI", blob, shoff + i * shentsize)
        if stype != SHT_NOBITS and offset + size > len(blob):
            raise CubinError(f"ELF section {i} lies outside the file (truncated?)")
        raw.append((name, stype, offset, size, link))
    _, _, str_off, str_size, _ = raw[shstrndx]
    names = blob[str_off : str_off + str_size]
    return [Section(_string(names, name), stype, offset, size, link) for name, stype, offset, size, link in raw]


def _string(table: bytes, offset: int) -> str:
    if offset >= len(table) and offset:
        raise CubinError("ELF string offset outside its table")
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else len(table)].decode("latin-1")


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


def sm_of(blob: bytes) -> int:
    """The SM number in a whole cubin's ELF header (90 for sm_90a); raises CubinError."""
    _sections(blob)
    return (int.from_bytes(blob[48:52], "little") >> 8) & 0xFF


def inspect(blob: bytes) -> CubinInfo:
    """Parse a cubin: arch (the ``a`` included), toolkit, each kernel's params/REQNTID/registers."""
    try:
        return _inspect(bytes(blob))
    except (struct.error, IndexError) as exc:
        raise CubinError(f"not a valid cubin: {exc}") from None


def _inspect(blob: bytes) -> CubinInfo:
    sections = _sections(blob)
    by_name = {s.name: s for s in sections}

    def data(section: Section) -> bytes:
        return b"" if section.type == SHT_NOBITS else blob[section.offset : section.offset + section.size]

    sm = (int.from_bytes(blob[48:52], "little") >> 8) & 0xFF
    accel = False
    if ".nv.compat" in by_name:
        for fmt, attr, payload in _attributes(data(by_name[".nv.compat"])):
            if attr == EICOMPAT_ACCELERATOR_TARGET and fmt == EIFMT_BVAL:
                accel = payload[0] == 1
    toolkit = ""
    if ".note.nv.tkinfo" in by_name:
        text = data(by_name[".note.nv.tkinfo"]).decode("latin-1")
        if TOOLKIT_MARKER in text:
            toolkit = text[text.index(TOOLKIT_MARKER) :].split("\x00")[0]
    kernels = {s.name[len(".text.") :]: KernelInfo() for s in sections if s.name.startswith(".text.")}
    for name, info in kernels.items():
        shared = by_name.get(f".nv.shared.{name}")
        info.shared = shared.size if shared is not None else 0
        sec = by_name.get(f".nv.info.{name}")
        if sec is None:
            continue
        for fmt, attr, payload in _attributes(data(sec)):
            if attr == EIATTR_KPARAM_INFO and fmt == EIFMT_SVAL:
                _, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
                info.params.append((ordinal, offset, (flags >> 18) & 0x3FFF))
            elif attr == EIATTR_REQNTID and fmt == EIFMT_SVAL:
                info.reqntid = struct.unpack_from(f"<{len(payload) // 4}I", payload)
        info.params.sort()
    symtab = by_name.get(".symtab")
    if ".nv.info" in by_name and symtab is not None and symtab.type == SHT_SYMTAB and symtab.link < len(sections):
        symbols, strings = data(symtab), data(sections[symtab.link])
        for fmt, attr, payload in _attributes(data(by_name[".nv.info"])):
            if attr == EIATTR_REGCOUNT and fmt == EIFMT_SVAL:
                index, regs = struct.unpack_from("<II", payload)
                (name_off,) = struct.unpack_from("<I", symbols, index * SYMBOL_BYTES)
                sym = _string(strings, name_off)
                if sym in kernels:
                    kernels[sym].registers = regs
    return CubinInfo(arch=f"sm_{sm}{'a' if accel else ''}", toolkit=toolkit, kernels=kernels)
