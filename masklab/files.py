"""JSON and text files written atomically (a temporary file, then a rename): run records,
results, configs. Nothing here is pickled."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def json_default(o: Any) -> Any:
    """``json.dumps``'s ``default``: numpy scalars and arrays, paths."""
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=json_default) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
