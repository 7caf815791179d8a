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


def read_jsonl(path: Path) -> list[dict]:
    """The JSON lines of ``path`` ([] when it does not exist), up to the first line cut by a
    kill (dropped: its row is redone)."""
    rows: list[dict] = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def append_jsonl(path: Path, row: dict) -> None:
    """Append ``row`` as one JSON line, flushed (a resumable run's record of one finished item).
    A last line cut by a kill (no line break at its end) is dropped first, as :func:`read_jsonl`
    drops it, so the new line does not join it."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.seek(0)
                f.truncate(f.read().rfind(b"\n") + 1)
    with open(path, "a") as f:
        f.write(json.dumps(row, default=json_default) + "\n")
        f.flush()


def make_out_dir(path: str | Path) -> Path:
    """Create the output folder ``path`` (and its parents); one clear error when it cannot be."""
    from masklab.util.errors import MasklabError

    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MasklabError(f"cannot create the output directory {out}: {e.strerror or e}") from None
    return out
