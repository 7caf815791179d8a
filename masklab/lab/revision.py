"""Which code made a run: the git revision and hashes of the source its study runs.

A results table is only checkable if every row in it came from the same code. Each run
record therefore stores, taken when the run starts:

* ``code``: :func:`code_hash` of the run function's module, i.e. a sha256 over the source
  of that module and of every masklab module it imports, directly or through others, at
  top level or inside functions (:func:`import_graph`). Editing a study's own code, or any
  module it uses, changes its hash; editing an unrelated study, the CLI or the docs does
  not, so finished runs of untouched studies stay valid;
* ``code_ast``: :func:`code_ast` of the same modules, the hash of their syntax trees
  without docstrings (:func:`normalised`): a comment, a docstring or a reformatting leaves
  it as it was, a changed expression does not. Records older than it have ``code`` only;
* ``git_rev``: the checkout's revision (``None`` outside a git checkout).

:func:`masklab.lab.runner.run_study` resumes only runs whose ``code_ast`` (``code`` for a
record without one) equals today's (unless told to keep older ones) and says so in
results.md when a table mixes hashes. :class:`Staleness` tells whether a committed result
was made by code that, comments, docstrings and formatting aside, is today's: directly by
``code_ast``, and for older records by finding a git revision whose source reproduces the
recorded ``code`` (:class:`History`) and comparing that source, normalised, with today's.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the masklab package (this file is masklab/lab/revision.py)
# modules that record which code made a run but compute nothing a run measures: left out of code_ast
BOOKKEEPING = frozenset({"masklab.lab.revision"})
MOVED = {  # old module or package -> new (the layout move of 2026-12-04, issue 54)
    "masklab.errors": "masklab.util.errors",
    "masklab.registry": "masklab.util.registry",
    "masklab.flags": "masklab.util.flags",
    "masklab.files": "masklab.util.files",
    "masklab.device": "masklab.util.device",
    "masklab.attention": "masklab.priors.attention",
    "masklab.bias": "masklab.priors.bias",
    "masklab.structures": "masklab.priors.structures",
    "masklab.qk_init": "masklab.priors.qk_init",
    "masklab.structures_from_evidence": "masklab.priors.structures_from_evidence",
    "masklab.document": "masklab.text.document",
    "masklab.selection": "masklab.text.selection",
    "masklab.query": "masklab.text.query",
    "masklab.inputs": "masklab.text.inputs",
    "masklab.revision": "masklab.lab.revision",
    "masklab.stats": "masklab.lab.stats",
    "masklab.runs": "masklab.lab.runs",
    "masklab.executors": "masklab.lab.executors",
    "masklab.runner": "masklab.lab.runner",
    "masklab.worker": "masklab.lab.worker",
    "masklab.distributed": "masklab.lab.distributed",
    "masklab.train": "masklab.lab.train",
    "masklab.report": "masklab.lab.report",
    "masklab.doctables": "masklab.lab.doctables",
    "masklab.studies": "masklab.lab.studies",
    "masklab.evidence": "masklab.lab.evidence",
    "masklab.routing": "masklab.lab.routing",
    "masklab.tasks": "masklab.lab.tasks",
    "masklab.pretrained.evidence": "masklab.lab.lm_evidence",
    "masklab.context.causal": "masklab.lab.labels",
    "masklab.context.realdocs_eval": "masklab.lab.realdocs",
    "masklab.context.train_router": "masklab.lab.train_router",
    "masklab.context.anchors": "masklab.lab.anchors",
    "masklab.context.pipeline": "masklab.lab.pipeline",
    "masklab.context.routers.oracle": "masklab.lab.routers.oracle",
    "masklab.context.trained": "masklab.context.routers.features",
    "masklab.context.routers.longllmlingua": "masklab.lab.routers.longllmlingua",
}
# a package's sources are from before that move when they hold this module
BEFORE_MOVE = "masklab.errors"
# the packages the move made (each ``__init__`` a docstring only, as ``pass`` once normalised)
NEW_PACKAGES = ("masklab.util", "masklab.priors", "masklab.text", "masklab.lab", "masklab.lab.routers")
_FROM = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<mod>masklab(?:\.\w+)*) import (?P<names>\([^)]*\)|[^\n#]*?)"
    r"(?P<tail>[ \t]*(?:#[^\n]*)?)$",
    re.M,
)


def module_name(path: Path, root: Path = ROOT) -> str:
    """``ROOT/studies/gotu.py`` -> ``masklab.lab.studies.gotu`` (a package's ``__init__`` -> the package)."""
    parts = ["masklab", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def moved(name: str, pairs: dict[str, str] = MOVED) -> str:
    """``name`` (a module or a name in one) after the layout move: the longest old prefix in
    ``pairs`` replaced by its new one (``name`` itself when none matches)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if (head := ".".join(parts[:i])) in pairs:
            return ".".join([pairs[head], *parts[i:]])
    return name


def _moved_from(m: re.Match, pairs: dict[str, str]) -> str:
    indent, mod, tail = m["indent"], m["mod"], m["tail"]
    inner = m["names"].strip()
    items = [n.strip() for n in inner.strip("()").replace("\n", " ").split(",") if n.strip()]
    split = [(name, alias) for name, _, alias in (tuple(p.strip() for p in i.partition(" as ")) for i in items)]
    if all(moved(f"{mod}.{name}", pairs) == f"{mod}.{name}" for name, _ in split):
        return m.group(0)
    groups: dict[str, list[str]] = {}
    for name, alias in split:
        new = moved(f"{mod}.{name}", pairs)
        parent, last = (mod, name) if new == f"{mod}.{name}" else tuple(new.rsplit(".", 1))
        alias = alias or (name if last != name else "")
        groups.setdefault(parent, []).append(f"{last} as {alias}" if alias and alias != last else last)
    lines = []
    for k, (parent, group) in enumerate(groups.items()):
        body = ", ".join(group)
        if inner.startswith("(") and len(indent) + len(parent) + len(body) > 110:
            body = "(\n" + "".join(f"{indent}    {g},\n" for g in group) + f"{indent})"
        lines.append(f"{indent}from {parent} import {body}" + (tail if k == 0 else ""))
    return "\n".join(lines)


def moved_source(text: str, pairs: dict[str, str] = MOVED) -> str:
    """A module's source with the names and paths of ``pairs`` rewritten as the layout move
    rewrote them (the same rules as its rewrite script: ``from masklab.x import y`` lines,
    dotted names, ``masklab/x/y.py`` and ``masklab/x/`` paths), so a source from before the
    move reads as the moved module's source."""
    text = _FROM.sub(lambda m: _moved_from(m, pairs), text)
    dotted = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(pairs, key=len, reverse=True))) + r")(?![\w])")
    text = dotted.sub(lambda m: pairs[m[1]], text)
    paths = {}
    for old, new in pairs.items():
        o, n = old.replace(".", "/"), new.replace(".", "/")
        paths[o + ".py"], paths[o + "/"] = n + ".py", n + "/"
    pattern = re.compile(r"(?<![\w/.])(" + "|".join(map(re.escape, sorted(paths, key=len, reverse=True))) + r")")
    return pattern.sub(lambda m: paths[m[1]], text)


def after_move(files: dict[str, bytes]) -> dict[str, bytes]:
    """Sources of the package read at some revision, as the layout move left them: sources
    from before the move (they hold :data:`BEFORE_MOVE`) renamed and rewritten
    (:func:`moved_source`; the package's ``__init__`` names its lazily imported modules
    relative to ``masklab``, and those names move too; the packages it made,
    :data:`NEW_PACKAGES`, are there with an empty body); later ones as they are."""
    if BEFORE_MOVE not in files:
        return files
    out = {
        **{p: b"pass\n" for p in NEW_PACKAGES},
        **{moved(m): moved_source(src.decode()).encode() for m, src in files.items()},
    }
    if "masklab" in out:
        relative = re.compile(r'(": ")(\w+)(")')
        out["masklab"] = relative.sub(
            lambda m: m[1] + moved(f"masklab.{m[2]}").removeprefix("masklab.") + m[3], out["masklab"].decode()
        ).encode()
    return out


def sources(root: Path = ROOT) -> dict[str, bytes]:
    """Module name -> source bytes of every ``.py`` file under ``root``."""
    return {module_name(p, root): p.read_bytes() for p in root.rglob("*.py")}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the masklab modules it imports, anywhere in its source (read with ``ast``:
    ``import masklab.x`` and ``from masklab[.x] import y``, at top level and in functions)."""
    return graph_of(sources(root))


def graph_of(files: dict[str, bytes]) -> dict[str, set[str]]:
    """:func:`import_graph` of sources given as module name -> bytes."""
    modules = set(files)
    return {mod: imported_by(parsed(src)[1], modules) - {mod} for mod, src in files.items()}


def import_targets(tree: ast.AST) -> tuple[tuple[str, str], ...]:
    """``(name, fallback)`` per imported name: the import names the module ``name`` if that
    is a module, else ``fallback`` (``from masklab import runner`` names a module, ``from
    masklab.x import f`` names x)."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(f"{node.module}.{a.name}", node.module) for a in node.names]
    return tuple(found)


def imported_by(targets: tuple[tuple[str, str], ...], modules: set[str]) -> set[str]:
    """The ``modules`` that :func:`import_targets` name."""
    return {t for name, fallback in targets if (t := name if name in modules else fallback) in modules}


def normalised(tree: ast.AST) -> str:
    """A text of ``tree`` that comments, docstrings and formatting do not change: every node's
    type and fields, without line and column numbers, with the docstring of the module and
    of every class and function dropped (a body left empty reads as ``pass``) and with
    fields that are None or empty left out (so a field a newer Python adds with an empty
    default, as 3.12 added ``type_params``, does not change it)."""

    def text(node: object) -> str:
        if isinstance(node, ast.AST):
            body = getattr(node, "body", None)
            if (
                isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                body = body[1:] or [ast.Pass()]
            fields = [(f, body if f == "body" else getattr(node, f, None)) for f in node._fields]
            return (
                f"{type(node).__name__}("
                + ", ".join(f"{f}={text(v)}" for f, v in fields if v is not None and v != [])
                + ")"
            )
        if isinstance(node, list):
            return "[" + ", ".join(text(v) for v in node) + "]"
        return repr(node)

    return text(tree)


@lru_cache(maxsize=None)
def parsed(source: bytes) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """:func:`normalised` text (as bytes) and :func:`import_targets` of a source (cached:
    most sources are the same at many git revisions)."""
    tree = ast.parse(source)
    return normalised(tree).encode(), import_targets(tree)


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
    return closure_hash(module, sources(root))


def code_ast(module: str, root: Path = ROOT) -> str:
    """:func:`code_hash` over the :func:`normalised` syntax trees of the same modules instead
    of their bytes: a comment, a docstring or a reformatting leaves it as it was. This
    module (:data:`BOOKKEEPING`) is left out: how a run's code is hashed changes no number."""
    return closure_hash(module, sources(root), normalise=True)


def closure_hash(
    module: str, files: dict[str, bytes], normalise: bool = False, graph: dict[str, set[str]] | None = None
) -> str:
    """:func:`code_hash` (or with ``normalise`` :func:`code_ast`) of ``module`` over the
    sources ``files`` (module name -> bytes; ``graph``: their :func:`graph_of`, if known)."""
    graph = graph_of(files) if graph is None else graph
    h = hashlib.sha256()
    if module not in graph:
        source = outside_source(module).encode()
        h.update(module.encode() + b"\0" + (parsed(source)[0] if normalise else source) + b"\0")
        graph = {**graph, module: imported_by(parsed(source)[1], set(files))}
    for m in closure(module, graph):
        if m in files and not (normalise and m in BOOKKEEPING):
            h.update(m.encode() + b"\0" + (parsed(files[m])[0] if normalise else files[m]) + b"\0")
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


class History:
    """masklab's source at git revisions of the checkout it runs from, read with git (one
    ``git cat-file --batch`` per blob list; blobs cached). Every method returns None or
    nothing when git or the revision is not there."""

    def __init__(self, root: Path = ROOT) -> None:
        self.root = self.cwd = root
        self.blobs: dict[str, bytes] = {}
        self.trees: dict[str, dict[str, bytes] | None] = {}
        top = self.git("rev-parse", "--show-toplevel")
        self.top = Path(top.strip()) if top else None
        self.cwd = self.top or root  # pathspecs are relative to the top
        self.prefix = root.resolve().relative_to(self.top.resolve()).as_posix() if self.top else ""

    def git(self, *args: str) -> str | None:
        try:
            p = subprocess.run(["git", *args], cwd=self.cwd, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
        return p.stdout.decode() if p.returncode == 0 else None

    def sources(self, rev: str) -> dict[str, bytes] | None:
        """:func:`sources` of the package at ``rev``."""
        if rev not in self.trees:
            self.trees[rev] = self._sources(rev)
        return self.trees[rev]

    def _sources(self, rev: str) -> dict[str, bytes] | None:
        if self.top is None or not re.fullmatch(r"[0-9a-fA-F]{4,40}", rev):
            return None
        listing = self.git("ls-tree", "-r", rev, "--", f"{self.prefix}/")
        if listing is None:
            return None
        files = {}  # path -> blob id
        for line in listing.splitlines():
            meta, _, path = line.partition("\t")
            if path.endswith(".py") and meta.split()[1] == "blob":
                files[path] = meta.split()[2]
        try:
            self._read([b for b in files.values() if b not in self.blobs])
        except (OSError, subprocess.SubprocessError):
            return None
        return {
            module_name(self.root / Path(path).relative_to(self.prefix), self.root): self.blobs[blob]
            for path, blob in files.items()
        }

    def _read(self, blobs: list[str]) -> None:
        if not blobs:
            return
        p = subprocess.run(
            ["git", "cat-file", "--batch"],
            cwd=self.cwd,
            input="".join(b + "\n" for b in blobs).encode(),
            capture_output=True,
            timeout=120,
            check=True,
        )
        data, at = p.stdout, 0
        for blob in blobs:
            end = data.index(b"\n", at)
            size = int(data[at:end].split()[2])
            self.blobs[blob] = data[end + 1 : end + 1 + size]
            at = end + 1 + size + 1

    def commits(self, since: str | None, until: str) -> list[str]:
        """The commits touching the package after ``since`` up to ``until``, oldest first
        (every one up to ``until`` when ``since`` is None)."""
        span = until if since is None else f"{since}..{until}"
        out = self.git("rev-list", "--reverse", span, "--", f"{self.prefix}/") if self.top else None
        return out.split() if out else []

    def added(self, path: Path) -> str:
        """The commit that added ``path`` (a results file), or ``HEAD`` when it is not committed."""
        out = self.git("log", "--diff-filter=A", "--format=%H", "--", str(Path(path).resolve())) if self.top else None
        return out.split()[-1] if out and out.split() else "HEAD"


class Staleness:
    """Whether a recorded run was made by today's code, comments, docstrings and formatting
    aside. ``modules`` are the run modules a record can name (study, pretrained and context
    modules); :meth:`verdict` says ``("current" | "stale" | "unknown", why)``:

    * a record with ``code_ast`` is current when some module's :func:`code_ast` is it today,
      or when at its ``git_rev`` some module's :func:`code_ast` is it and that module's
      normalised closure there, read as the layout move left it (:func:`after_move`), is
      today's (so a run made before the move of 2026-12-04 keeps its stamp);
    * a record with only ``code`` is current when some module's :func:`code_hash` is it today.
      Otherwise its code is looked for in git: at its ``git_rev`` (``+`` dropped), then at
      every later commit touching the package (a hash taken when a run ended, after edits
      committed later, is found there), or without a ``git_rev`` at the commits up to the
      one that committed the results file, newest first, then after it. At the first revision where
      a module's :func:`code_hash` is the recorded one, that module's :func:`code_ast` there
      (its sources read as the layout move left them, :func:`after_move`, and the module by
      its new name) is compared with today's: equal is current, else stale, naming the modules whose
      normalised source differs. A hash no revision reproduces (a run made from
      uncommitted edits) is unknown, and so is a record without ``code``.
    """

    def __init__(self, prefixes: tuple[str, ...], root: Path = ROOT) -> None:
        self.prefixes = prefixes
        self.history = History(root)
        self.now = sources(root)
        self.now_graph = graph_of(self.now)
        runnable = [m for m in self.now_graph if m.startswith(prefixes)]
        self.code_now = {closure_hash(m, self.now, graph=self.now_graph) for m in runnable}
        self.ast_now = {closure_hash(m, self.now, True, self.now_graph) for m in runnable}
        self.at_rev: dict[str, dict[str, str]] = {}  # rev -> code_hash -> module
        self.ast_at_rev: dict[str, dict[str, str]] = {}  # rev -> code_ast -> module
        self.memo: dict[tuple, tuple[str, str]] = {}

    def verdict(self, code: str | None, code_ast_: str | None, git_rev: str | None, made_in: Path) -> tuple[str, str]:
        key = (code, code_ast_, git_rev, made_in)
        if key not in self.memo:
            self.memo[key] = self._verdict(code, code_ast_, git_rev, made_in)
        return self.memo[key]

    def _verdict(self, code, code_ast_, git_rev, made_in) -> tuple[str, str]:
        if code_ast_:
            if code_ast_ in self.ast_now:
                return "current", ""
            rev = (git_rev or "").rstrip("+") or None
            module = self.modules_at(rev, normalise=True).get(code_ast_) if rev else None
            if module is not None:
                return self.compare(module, rev)
            return "stale", f"code_ast {code_ast_} is no module's today"
        if not code:
            return "unknown", "records no code"
        if code in self.code_now:
            return "current", ""
        rev = (git_rev or "").rstrip("+") or None
        if rev:
            tried = [rev, *self.history.commits(rev, "HEAD")]
        else:  # outward from the commit that committed the file: the code just before it, then after it
            until = self.history.added(made_in)
            tried = self.history.commits(None, until)[::-1] + self.history.commits(until, "HEAD")
        for r in dict.fromkeys(tried):
            module = self.modules_at(r).get(code)
            if module is not None:
                return self.compare(module, r)
        if rev:
            return "unknown", f"no module has it at git {git_rev} or at the commits after it that touch masklab"
        return "unknown", "no git_rev recorded, and no commit reproduces it"

    def compare(self, module: str, rev: str) -> tuple[str, str]:
        """The verdict on ``module`` as it was at ``rev`` (named as then): current when its
        normalised closure there, read as the layout move left it, is today's."""
        files = self.history.sources(rev) or {}
        then, module = after_move(files), moved(module) if BEFORE_MOVE in files else module
        if module not in self.now_graph:
            return "stale", f"{module} (its code at git {rev[:7]}) is gone"
        if closure_hash(module, then, True) == closure_hash(module, self.now, True, self.now_graph):
            return "current", ""
        changed = self.changed(module, then)
        listed = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        return "stale", f"{module} at git {rev[:7]} differs from today's in {listed}"

    def modules_at(self, rev: str, normalise: bool = False) -> dict[str, str]:
        """code_hash (``normalise``: code_ast) -> module (named as at ``rev``) for the run
        modules at ``rev`` (those whose name, after the layout move, has one of the prefixes)."""
        memo = self.ast_at_rev if normalise else self.at_rev
        if rev not in memo:
            files = self.history.sources(rev) or {}
            try:
                graph = graph_of(files)
            except (SyntaxError, ValueError):  # a revision whose source does not parse made no run
                graph = {}
            name = moved if BEFORE_MOVE in files else str
            memo[rev] = {
                closure_hash(m, files, normalise, graph): m for m in graph if name(m).startswith(self.prefixes)
            }
        return memo[rev]

    def changed(self, module: str, then: dict[str, bytes]) -> list[str]:
        """The modules of ``module``'s closure, then or now, whose normalised source differs."""
        mods = set(closure(module, graph_of(then))) | set(closure(module, self.now_graph))
        text = lambda files, m: parsed(files[m])[0] if m in files else None  # noqa: E731
        return sorted(m for m in mods - BOOKKEEPING if text(then, m) != text(self.now, m))
