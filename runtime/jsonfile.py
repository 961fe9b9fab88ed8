"""The one reader of JSON a user hands us (manifests, plan tables, shapes and model files, tuner results, config.json).

A file is read through ``files.read_bounded`` (a regular file, bounded size,
opened non-blocking: a FIFO or a device never blocks us), decoded as UTF-8 and
parsed without NaN or Infinity; its nesting is bounded. Every problem raises
``InputError`` with one line that names the file and, for a field, the field,
so a caller prints it and exits 2. The typed accessors (``obj``, ``text``,
``pos_int``, ...) check a value where it is used and name it by its place
(``entries[3] field 'n'``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .files import FileProblem, read_bounded

# A user file (plan table, config.json, tuner results) is far below this; a 1000-variant manifest is about 1 MB.
JSON_CAP = 64 * 1024 * 1024
# Every format we read nests fewer than ten levels; deeper is hostile or not ours.
MAX_DEPTH = 32
# n, k and m reach the kernels as i32.
I32_MAX = 2**31 - 1


class InputError(ValueError):
    """A file (or one field of it) that is refused; the message is one line naming the file."""


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _finite(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _depth(value) -> int:
    """The nesting depth of a parsed value, without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def show(value) -> str:
    """A value as a refusal may print it: ASCII only (no control character reaches the terminal), at most 60."""
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."


def where(path) -> str:
    """A path as a refusal names it: the path itself when printable, else its ASCII escape."""
    text = str(path)
    return text if printable(text) else ascii(text)


def printable(text: str) -> bool:
    """No control character and encodable as UTF-8 (a lone surrogate from an undecodable name is not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return text.isprintable()


def read_json(path, what: str = "JSON file", cap: int = JSON_CAP, follow_links: bool = True):
    """The parsed JSON of ``path``; raises InputError ``<path>: <what> <reason>`` (one line).

    A user's file may be a link (a Hugging Face cache links config.json to its blob): it is followed unless
    ``follow_links`` is False (an artifact folder's manifest, which a build never writes as a link).
    """
    name = where(path)
    try:
        real = Path(os.path.realpath(path)) if follow_links else Path(path)
        text = read_bounded(real, cap).decode("utf-8")
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite)
    except FileProblem as exc:
        raise InputError(f"{name}: {what} {exc}") from None
    except OSError as exc:
        raise InputError(f"{name}: {what} unreadable ({exc.strerror or exc})") from None
    except RecursionError:
        raise InputError(f"{name}: unreadable {what} (nested too deeply)") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: unreadable {what} (not UTF-8: {exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise InputError(f"{name}: unreadable {what} ({ascii(str(exc))[1:-1]})") from None
    if _depth(data) > MAX_DEPTH:
        raise InputError(f"{name}: unreadable {what} (nested too deeply: more than {MAX_DEPTH} levels)")
    return data


class Fields:
    """Typed, ranged access to the parsed JSON of one file: each refusal is InputError naming file and field."""

    def __init__(self, path, error=InputError):
        self.name, self.error = where(path), error

    def fail(self, place: str, value, must: str):
        raise self.error(f"{self.name}: {place} is {show(value)}, must be {must}")

    def get(self, record, key: str, place: str = ""):
        """record[key], refusing a missing key."""
        if type(record) is not dict:
            self.fail(place or "the file", record, "an object")
        if key not in record:
            raise self.error(f"{self.name}: {place}field {key!r} missing")
        return record[key]

    def obj(self, value, place: str) -> dict:
        if type(value) is not dict:
            self.fail(place, value, "an object")
        return value

    def lst(self, value, place: str) -> list:
        if type(value) is not list:
            self.fail(place, value, "a list")
        return value

    def text(self, value, place: str) -> str:
        if type(value) is not str or not value or not value.isprintable():
            self.fail(place, value, "a non-empty printable string")
        return value

    def pos_int(self, value, place: str, hi: int = I32_MAX) -> int:
        if type(value) is not int or not 1 <= value <= hi:
            self.fail(place, value, f"an int in 1..{hi}")
        return value

    def number(self, value, place: str, lo: float = 0.0) -> float:
        if type(value) not in (int, float) or value < lo:
            self.fail(place, value, f"a number >= {lo:g}")
        return value

    def boolean(self, value, place: str) -> bool:
        if type(value) is not bool:
            self.fail(place, value, "true or false")
        return value
