"""Reading artifact files safely: plain names inside the folder, regular files only, bounded size.

A FIFO in place of a cubin would block ``read`` forever, a device file or a
huge file would be read whole: so the path is stat'ed without following a
link, opened non-blocking without following one, checked again on the open
descriptor (the file may have been swapped in between), and read up to a cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# A 1000-variant manifest is about 1 MB; cubins are 5-300 kB (K=16384 fully unrolled is the largest).
MANIFEST_CAP = 64 * 1024 * 1024
CUBIN_CAP = 16 * 1024 * 1024


class FileProblem(ValueError):
    """A file that may not be read; the message is the reason, without the path."""


def plain_name(name) -> bool:
    """True for a file name that stays inside its folder: no separator, no ``..``, nothing absolute."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and not os.path.isabs(name)
    )


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    for test, what in kinds:
        if test(mode):
            return what
    return "not a regular file"


def read_bounded(path: Path, cap: int) -> bytes:
    """The bytes of the regular file ``path`` (at most ``cap``); raises FileProblem with the reason."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FileProblem("missing") from None
    except OSError as exc:
        raise FileProblem(f"unreadable ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileProblem(f"{_kind(st.st_mode)}, not a regular file")
    if st.st_size > cap:
        raise FileProblem(f"{st.st_size} bytes, more than the {cap} allowed")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise FileProblem(f"unreadable ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem(f"{_kind(st.st_mode)}, not a regular file")
        chunks, left = [], cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise FileProblem(f"unreadable ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    blob = b"".join(chunks)
    if len(blob) > cap:
        raise FileProblem(f"more than the {cap} bytes allowed")
    return blob
