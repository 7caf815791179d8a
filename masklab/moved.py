"""Old import paths of public modules and names that moved: they keep working for one
release, each with a :class:`DeprecationWarning` naming the new path, and then go.

A moved module leaves a file at its old path that calls :func:`alias_module` (the old name
is then the new module itself, so its private names, ``isinstance`` and monkeypatching
behave as with the new path); a module whose names moved or were renamed answers the old
names with ``__getattr__ = old_names(__name__, {...})`` (PEP 562). The list of old paths,
with when each goes, is in docs/design.md ("Moved names"); ``tests/test_moved.py`` holds it.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType
from typing import Any, Callable


def _warn(old: str, new: str) -> None:
    """Warn that ``old`` is now ``new``, attributed to the code that named ``old`` (not to
    importlib's frames, this file or the old module's own file), so Python's default filters
    show it to a script that imports the old path."""
    frame, level = sys._getframe(1), 2
    while frame is not None:
        name = frame.f_code.co_filename
        if "importlib" in name and "_bootstrap" in name:  # warnings.warn skips these frames itself
            frame = frame.f_back
        elif name == __file__ or frame.f_globals.get("__name__") == old:
            frame, level = frame.f_back, level + 1
        else:
            break
    warnings.warn(f"{old} moved to {new}; the old path is an alias for one release, then goes",
                  DeprecationWarning, stacklevel=level)


def alias_module(old: str, new: str) -> ModuleType:
    """Make module ``old`` (the caller's ``__name__``) the module ``new``, with a warning."""
    _warn(old, new)
    module = importlib.import_module(new)
    sys.modules[old] = module  # importlib hands back sys.modules[old] after running the old file
    return module


def old_names(module: str, moved: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that answers each old name in ``moved`` (old name -> the new
    ``package.module.name``) with the object at the new path, with a warning."""
    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, attr = moved[name].rpartition(".")
        _warn(f"{module}.{name}", moved[name])
        return getattr(importlib.import_module(where), attr)

    return __getattr__
