"""Tables and numbers in README.md and docs/*.md, generated from results files.

A generated block is an HTML comment naming its source, the generated text, and a closing
comment. Two kinds:

``<!-- table FILE metrics=a,b [task=..] [method=..] [model=..] [n=..] [rows=summary] [digits=3] [paper=yes]
[ci=yes] -->``
    A markdown table of the rows of ``FILE``'s list ``rows`` (default ``summary``) kept by
    the filters (comma lists; rows keep the file's order): task and model columns when they
    vary, method and n, then one column per metric as
    ``mean ± std`` (the mean alone for one run; :func:`masklab.lab.report.stat_cell`), with
    ``ci=yes`` followed by the row's 95% interval ``[M_lo, M_hi]`` where it has one, then a
    line naming the file, its command and the code that made it. Closed by ``<!-- /table -->``.

``<!-- value FILE key=a.b.0.c [digits=3] -->`` or
``<!-- value FILE metric=M [task=..] [method=..] [model=..] [n=..] [over=METHOD] [digits=3] -->``
    One number inline: a dotted path into the JSON (list items by index), or a metric of
    the one summary row the filters select; with ``over=METHOD``, that row's mean divided by
    the mean of the row the same filters select with ``method=METHOD`` (a speed-up, say:
    ``metric=seconds method=full over=router``). Closed by ``<!-- /value -->``.

``FILE`` is relative to the repository root (the directory holding README.md). Options are
``key=value`` words; nothing is evaluated. :func:`render` rewrites every block of a
markdown text; ``masklab report`` rewrites the files and ``--check`` only compares
(the test suite runs the comparison, so a hand-edited number fails it).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from masklab.lab import revision
from masklab.util.errors import MasklabError
from masklab.util.files import atomic_write_text, read_json
from masklab.lab.report import fmt, fmt_p, is_p_value, paper_cell, stat_cell

BLOCK = re.compile(r"<!-- (table|value) (.*?) -->(.*?)<!-- /\1 -->", re.S)
OPTIONS = {
    "table": {"metrics", "task", "method", "model", "n", "rows", "digits", "paper", "ci"},
    "value": {"key", "metric", "task", "method", "model", "n", "over", "digits"},
}
FILTERS = ("task", "method", "model", "n")


def doc_files(root: Path) -> list[Path]:
    """README.md and every markdown file under docs/ (not under results/: those are outputs)."""
    return [p for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))] if p.exists()]


def parse(kind: str, words: str, where: str) -> tuple[str, dict[str, str]]:
    """``"FILE a=1 b=x,y"`` -> ``("FILE", {"a": "1", "b": "x,y"})``; unknown options are an error."""
    head, *rest = words.split()
    opts: dict[str, str] = {}
    for w in rest:
        name, eq, value = w.partition("=")
        if not eq or name not in OPTIONS[kind]:
            raise MasklabError(
                f"{where}: bad option {w!r} in a {kind} block (options: {', '.join(sorted(OPTIONS[kind]))})"
            )
        opts[name] = value
    return head, opts


def load(root: Path, name: str, where: str, cache: dict[str, Any]) -> Any:
    if name not in cache:
        path = root / name
        if not path.is_file():
            raise MasklabError(f"{where}: {name} does not exist (run the command that makes it, then `masklab report`)")
        cache[name] = read_json(path)
    return cache[name]


def select(rows: list[dict], opts: dict[str, str]) -> list[dict]:
    """The rows whose task/method/model are among the filters' comma lists."""
    for f in FILTERS:
        if f in opts:
            allowed = opts[f].split(",")
            rows = [r for r in rows if str(r.get(f, "")) in allowed]
    return rows


def provenance(name: str, data: dict) -> str:
    """The line under a generated table: source file, and its command, git revision and code
    hashes where the file records them (a study's results.json does; a benchmark's JSON may
    hold only its command)."""
    facts = [f"`{data['command']}`"] if data.get("command") else []
    if rev := data.get("environment", {}).get("git_rev"):
        facts.append(f"git {rev}")
    if code := data.get("code"):  # a study's {hash: runs}, or one hash (a benchmark's stamp, as stale_results reads it)
        facts.append("code " + (code if isinstance(code, str) else ", ".join(code)))
    return f"<sub>Generated from `{name}`{' (' + '; '.join(facts) + ')' if facts else ''} by `masklab report`.</sub>"


def table(root: Path, name: str, opts: dict[str, str], where: str, cache: dict) -> str:
    data = load(root, name, where, cache)
    if "metrics" not in opts:
        raise MasklabError(f"{where}: a table block needs metrics=NAME[,NAME...]")
    rows = select(data.get(opts.get("rows", "summary")) or [], opts)
    if not rows:
        raise MasklabError(f"{where}: no rows of {name} match {opts}")
    metrics = opts["metrics"].split(",")
    digits = int(opts.get("digits", 3))
    # task and model get a column when they vary over the rows; method and n always do
    keys = [k for k in ("task", "model") if len({r.get(k) for r in rows}) > 1] + [
        k for k in ("method", "n") if any(k in r for r in rows)
    ]
    head = [*keys, *metrics, *(["paper"] if opts.get("paper") == "yes" else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r.get(k, "-")) for k in keys] + [cell(r, m, digits, opts.get("ci") == "yes") for m in metrics]
        if opts.get("paper") == "yes":
            cells.append(paper_cell(data.get("paper", []), r.get("task"), r.get("method")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n" + "\n".join(lines) + "\n\n" + provenance(name, data) + "\n"


def cell(row: dict, metric: str, digits: int, ci: bool = False) -> str:
    """One table cell: mean ± std (or the value), and with ``ci`` the row's 95% interval
    ``[metric_lo, metric_hi]`` where it has one (``ci=yes`` on a table block)."""
    text = (
        stat_cell(row, metric, digits)
        if f"{metric}_mean" in row
        else (fmt_p if is_p_value(metric) else fmt)(row.get(metric), digits)
    )
    if ci and row.get(f"{metric}_lo") is not None:
        text += f" [{fmt(row[f'{metric}_lo'], 2)}, {fmt(row[f'{metric}_hi'], 2)}]"
    return text


def value(root: Path, name: str, opts: dict[str, str], where: str, cache: dict) -> str:
    data = load(root, name, where, cache)
    digits = int(opts.get("digits", 3))
    if "key" in opts:
        v: Any = data
        for part in opts["key"].split("."):
            try:
                v = v[int(part)] if isinstance(v, list) else v[part]
            except (KeyError, IndexError, ValueError, TypeError):
                raise MasklabError(f"{where}: {name} has no {opts['key']}") from None
        return (fmt_p if is_p_value(opts["key"].split(".")[-1]) else fmt)(v, digits)
    if "metric" not in opts:
        raise MasklabError(f"{where}: a value block needs key=PATH or metric=NAME")
    m = opts["metric"]

    def one_row(filters: dict[str, str]) -> dict:
        rows = select(data.get("summary") or [], filters)
        if len(rows) != 1:
            raise MasklabError(f"{where}: the filters select {len(rows)} summary rows of {name}, not one")
        return rows[0]

    row = one_row(opts)
    if "over" in opts:
        below = one_row({**opts, "method": opts["over"]})
        a, b = row.get(f"{m}_mean", row.get(m)), below.get(f"{m}_mean", below.get(m))
        if a is None or not b:
            raise MasklabError(f"{where}: {m} of {opts.get('method')} over {opts['over']} is undefined in {name}")
        return fmt(a / b, digits)
    return stat_cell(row, m, digits) if f"{m}_mean" in row else (fmt_p if is_p_value(m) else fmt)(row.get(m), digits)


def render(text: str, root: Path, where: str = "", cache: dict | None = None) -> str:
    """``text`` with every block's body regenerated from its file. Blocks inside fenced
    code (between lines starting with three backticks) are examples and left alone."""
    cache = {} if cache is None else cache
    pieces = re.split(r"(^```.*?^```[^\n]*$)", text, flags=re.S | re.M)  # odd indices: fenced code
    offset = 0
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            pieces[i] = render_prose(piece, root, where, text.count("\n", 0, offset), cache)
        offset += len(piece)
    return "".join(pieces)


def render_prose(text: str, root: Path, where: str, first_line: int, cache: dict) -> str:
    def one(m: re.Match) -> str:
        kind, words = m.group(1), m.group(2)
        at = f"{where}:{first_line + text.count(chr(10), 0, m.start()) + 1}"
        name, opts = parse(kind, words, at)
        body = (table if kind == "table" else value)(root, name, opts, at, cache)
        return f"<!-- {kind} {words} -->{body}<!-- /{kind} -->"

    out = BLOCK.sub(one, text)
    if len(re.findall(r"<!-- (?:table|value) ", text)) != len(BLOCK.findall(text)):
        raise MasklabError(f"{where}: a table/value block is not closed (<!-- /table --> or <!-- /value -->)")
    return out


RUN_MODULES = (
    "masklab.lab.",
    "masklab.pretrained.",
    "masklab.context.",
)  # masklab.lab.: studies, realdocs, train-router


def stale_results(root: Path) -> list[tuple[Path, str, dict[str, int]]]:
    """The results files under ``root/results`` (every ``results.json`` and every other JSON
    file a README/docs block quotes) not made by this checkout's code, comments, docstrings
    and formatting aside: ``(path, "stale" | "unknown", {why: runs})`` for each, judged run
    by run with :class:`masklab.lab.revision.Staleness` (a file without runs by its own
    ``code``, its meta's for a router evaluation). A file that records no code (a
    ``wall.json``, a derivation) counts as the ``results.json`` beside it, when there is one."""
    judge = revision.Staleness(RUN_MODULES)
    verdicts: dict[Path, tuple[str, dict[str, int]]] = {}

    def verdict(path: Path) -> tuple[str, dict[str, int]]:
        if path not in verdicts:
            data = read_json(path)
            env_rev = (data.get("environment") or {}).get("git_rev")
            if "runs" in data:
                records = [(r.get("code"), r.get("code_ast"), r.get("git_rev") or env_rev) for r in data["runs"]]
            elif any("stamp" in r for r in data.get("rows", [])):  # per-question rows (masklab realdocs)
                records = [(r["stamp"].get("code"), r["stamp"].get("code_ast"), env_rev) for r in data["rows"]]
            else:
                meta = data if isinstance(data.get("code"), str) or "code_ast" in data else (data.get("router") or {})
                records = [(meta.get("code"), meta.get("code_ast"), meta.get("git_rev") or env_rev)]
            beside = path.parent / "results.json"
            if not any(code or ast_ for code, ast_, _ in records) and path.name != "results.json" and beside.is_file():
                state, why = verdict(beside)
                verdicts[path] = state, ({f"no code of its own; {beside.name} beside it is {state}": 1} if why else {})
                return verdicts[path]
            whys: Counter = Counter()
            states = set()
            for code, ast_, rev in records:
                state, why = judge.verdict(code, ast_, rev, path)
                if state != "current":
                    states.add(state)
                    whys[f"code {ast_ or code}: {why}" if (ast_ or code) else why] += 1
            verdicts[path] = ("stale" if "stale" in states else "unknown" if states else "current"), dict(whys)
        return verdicts[path]

    out = []
    for path in results_paths(root):
        state, whys = verdict(path)
        if state != "current":
            out.append((path, state, whys))
    return out


def results_paths(root: Path) -> list[Path]:
    """Every ``results.json`` under ``root/results`` and every other results file a README/docs block quotes."""
    quoted = {root / m.group(2).split()[0] for doc in doc_files(root) for m in BLOCK.finditer(doc.read_text())}
    return sorted(
        set((root / "results").rglob("results.json")) | {p for p in quoted if p.is_file() and "results" in p.parts}
    )


def update(root: Path, check: bool = False) -> list[Path]:
    """Regenerate the blocks of :func:`doc_files`; return the files whose blocks differed
    (rewritten unless ``check``)."""
    changed = []
    cache: dict = {}
    for path in doc_files(root):
        text = path.read_text()
        new = render(text, root, str(path.relative_to(root)), cache)
        if new != text:
            changed.append(path)
            if not check:
                atomic_write_text(path, new)
    return changed
