"""What an object keeps alive: the bytes objects reachable from it through containers, dataclasses and
instance attributes (types, modules and functions are not followed: they are the program, not its data)."""

from __future__ import annotations

import gc
import types

_STOP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def retained_bytes(root) -> list[bytes]:
    """Every distinct bytes / bytearray / memoryview object reachable from ``root``."""
    seen, found, todo = set(), [], [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, _STOP):
            continue
        seen.add(id(obj))
        if isinstance(obj, (bytes, bytearray, memoryview)):
            found.append(obj)
            continue
        todo.extend(gc.get_referents(obj))
        slots = [name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())]
        todo.extend(getattr(obj, name) for name in slots if hasattr(obj, name))
    return found
