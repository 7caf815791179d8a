"""Public modules and names that moved keep their old paths for one release, with a
DeprecationWarning naming the new path (masklab/moved.py): every row of docs/design.md's
"Moved names" table."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def moved_rows() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "design.md").read_text()
    table = text.split("## Moved names", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \| [\d-]+ \|$", table, re.M)


def test_the_table_lists_the_moves():
    rows = dict(moved_rows())
    assert rows["masklab.hf"] == "masklab.pretrained.hf" and len(rows) >= 10


def is_module(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except ModuleNotFoundError:  # a name inside a module (the parent is no package)
        return False


@pytest.mark.parametrize("old,new", moved_rows())
def test_the_old_path_gives_the_new_object_and_warns(old, new, monkeypatch):
    message = f"{re.escape(old)} moved to {re.escape(new)}"
    if is_module(new):
        monkeypatch.delitem(sys.modules, old, raising=False)  # import it afresh, whatever ran before
        with pytest.warns(DeprecationWarning, match=message):
            assert importlib.import_module(old) is importlib.import_module(new)
    else:  # a name in a module
        (where, _, name), (new_where, _, new_name) = old.rpartition("."), new.rpartition(".")
        with pytest.warns(DeprecationWarning, match=message):
            assert getattr(importlib.import_module(where), name) is getattr(importlib.import_module(new_where), new_name)


def test_a_script_that_imports_the_old_paths_runs_and_sees_the_warnings():
    """As an outside script (Python's default filters show a DeprecationWarning only when
    it is attributed to __main__): each warning points at the script's own import line."""
    script = "from masklab.hf import attach_priors\nfrom masklab.routing import Router\nprint(attach_priors.__module__)\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"} | {"PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert p.returncode == 0 and p.stdout == "masklab.pretrained.hf\n", p.stderr
    assert "<string>:1: DeprecationWarning: masklab.hf moved to masklab.pretrained.hf" in p.stderr, p.stderr
    assert "<string>:2: DeprecationWarning: masklab.routing.Router moved to masklab.routing.TokenRouter" in p.stderr


def test_unknown_names_still_raise_attribute_error():
    import masklab.routing.routers as routers

    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        routers.Nope  # noqa: B018
