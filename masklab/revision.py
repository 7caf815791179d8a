"""Which code made a run: the git revision and a hash of the source its study runs.

A results table is only checkable if every row in it came from the same code. Each run
record therefore stores:

* ``code``: :func:`code_hash` of the run function's module, i.e. a sha256 over the source
  of that module and of every masklab module it imports, directly or through others, at
  top level or inside functions (:func:`import_graph`). Editing a study's own code, or any
  module it uses, changes its hash; editing an unrelated study, the CLI or the docs does
  not, so finished runs of untouched studies stay valid;
* ``git_rev``: the checkout's revision (``None`` outside a git checkout), for people.

:func:`masklab.runner.run_study` resumes only runs whose ``code`` equals today's (unless
told to keep older ones) and says so in results.md when a table mixes hashes.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).parent


def module_name(path: Path, root: Path = ROOT) -> str:
    """``ROOT/studies/gotu.py`` -> ``masklab.studies.gotu`` (a package's ``__init__`` -> the package)."""
    parts = ["masklab", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the masklab modules it imports, anywhere in its source (read with ``ast``:
    ``import masklab.x`` and ``from masklab[.x] import y``, at top level and in functions)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    return {mod: imported(ast.parse(path.read_text(), str(path)), set(files)) - {mod} for mod, path in files.items()}


def imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The ``modules`` a parsed source imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from masklab import runner` names a module; `from masklab.x import f` names x
            targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules}
    return found


def closure(module: str, graph: dict[str, set[str]]) -> list[str]:
    """``module`` and every module it reaches in ``graph``, sorted. A submodule's package
    ``__init__`` counts too (importing ``masklab.a.b`` runs ``masklab.a``)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen or m not in graph:
            continue
        seen.add(m)
        todo += graph[m]
        todo += [".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)]
    return sorted(seen)


def code_hash(module: str, root: Path = ROOT) -> str:
    """12 hex digits of sha256 over (name, source) of :func:`closure` of ``module``.

    A module that is not a file of the package (a study defined at run time, as the tests
    of docs/design.md's examples do) counts with the source ``inspect`` finds for it (none
    when it has none) and the masklab modules that source imports."""
    graph = import_graph(root)
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    h = hashlib.sha256()
    if module not in graph:
        source = outside_source(module)
        h.update(module.encode() + b"\0" + source.encode() + b"\0")
        graph = {**graph, module: imported(ast.parse(source), set(files))}
    for m in closure(module, graph):
        if m in files:
            h.update(m.encode() + b"\0" + files[m].read_bytes() + b"\0")
    return h.hexdigest()[:12]


def outside_source(module: str) -> str:
    """The source of an imported module that is not a file of the package, or ``""``."""
    try:
        return inspect.getsource(sys.modules.get(module) or importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return ""


@lru_cache(maxsize=1)
def git_rev() -> str | None:
    """Short git revision of the checkout masklab runs from, with ``+`` when masklab's
    source has uncommitted changes; None when it is not a git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=5)

    try:
        rev = git("rev-parse", "--short", "HEAD")
        if rev.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--", ".").stdout.strip()
        return rev.stdout.strip() + ("+" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None
