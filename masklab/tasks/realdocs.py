"""The real-document benchmark: real files (licences, FAQs, changelogs, man pages, Python's
documentation, READMEs) with questions a user would ask and their answering sentences
marked by text (format: ``masklab/data/realdocs/FORMAT.md``; sources and licences:
``SOURCES.md``).

``load(split)`` returns :class:`RealQuestion` s (``split``: ``val``, ``test`` or ``all``);
it checks every file against ``frozen.json`` (the benchmark was frozen before the router
work it judges), so a result that names :func:`digest` names exactly these questions.
``python -m masklab.tasks.realdocs --check`` validates the files (every evidence string
occurs once in its document); ``--freeze`` writes ``frozen.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from masklab.errors import MasklabError

ROOT = Path(__file__).resolve().parent.parent / "data" / "realdocs"
KINDS = ("single", "two", "latest")
SPLITS = ("val", "test")


@dataclass(frozen=True)
class RealQuestion:
    """One question about one real document; ``evidence``/``stale``: exact substrings of
    ``text`` (the answering sentences; the older statements of a ``latest`` fact)."""

    id: str
    doc: str
    kind: str
    question: str
    evidence: tuple[str, ...]
    answers: tuple[str, ...]
    text: str = field(repr=False)
    stale: tuple[str, ...] = ()

    def spans(self, which: str = "evidence") -> list[tuple[int, int]]:
        """Character spans of the evidence (or ``stale``) strings in :attr:`text`."""
        out = []
        for s in getattr(self, which):
            i = self.text.find(s)
            out.append((i, i + len(s)))
        return out

    def is_correct(self, answer: str) -> bool:
        """Whether one of the acceptable answers appears in ``answer`` (case- and
        space-insensitively)."""
        got = _norm(answer)
        return any(_norm(a) in got for a in self.answers)


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.lower()).strip()


def _files(root: Path) -> list[Path]:
    return sorted([root / "split.json", *(root / "docs").glob("*.txt"), *(root / "questions").glob("*.jsonl")])


def _hashes(root: Path) -> dict[str, str]:
    """sha256 of every benchmark file, by its path in ``root``."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in _files(root)}


def digest(root: Path = ROOT) -> str:
    """12 hex digits of sha256 over every benchmark file (names and bytes)."""
    h = hashlib.sha256()
    for p in _files(root):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _read(root: Path) -> tuple[dict, list[RealQuestion]]:
    split_path = root / "split.json"
    if not split_path.is_file():
        raise MasklabError(f"no benchmark at {root}: {split_path} is missing")
    split = json.loads(split_path.read_text())
    docs = {p.stem: p.read_text(encoding="utf-8") for p in (root / "docs").glob("*.txt")}
    qs: list[RealQuestion] = []
    for p in sorted((root / "questions").glob("*.jsonl")):
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{p.name}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise MasklabError(f"{where}: not JSON ({e})") from None
            missing = {"id", "doc", "kind", "question", "evidence", "answers"} - set(row)
            if missing:
                raise MasklabError(f"{where}: missing {', '.join(sorted(missing))}")
            if row["doc"] not in docs:
                raise MasklabError(f"{where}: no document docs/{row['doc']}.txt")
            if row["kind"] not in KINDS:
                raise MasklabError(f"{where}: kind {row['kind']!r} is not one of {', '.join(KINDS)}")
            text = docs[row["doc"]]
            for which in ("evidence", "stale"):
                for s in row.get(which, []):
                    if text.count(s) != 1:
                        raise MasklabError(f"{where}: {which} string occurs {text.count(s)} times in "
                                           f"docs/{row['doc']}.txt, not once: {s[:60]!r}")
            if not row["evidence"] or not row["answers"]:
                raise MasklabError(f"{where}: evidence and answers must not be empty")
            if row["kind"] == "two" and len(row["evidence"]) < 2:
                raise MasklabError(f"{where}: a 'two' question needs two evidence strings")
            if row["kind"] == "latest" and not row.get("stale"):
                raise MasklabError(f"{where}: a 'latest' question needs its older statements in 'stale'")
            qs.append(RealQuestion(row["id"], row["doc"], row["kind"], row["question"], tuple(row["evidence"]),
                                   tuple(row["answers"]), text, tuple(row.get("stale", ()))))
    ids = [q.id for q in qs]
    if len(set(ids)) != len(ids):
        raise MasklabError("question ids are not unique")
    listed = set(split.get("val", [])) | set(split.get("test", []))
    if set(split.get("val", [])) & set(split.get("test", [])):
        raise MasklabError("a document is in both val and test")
    if listed != set(docs):
        raise MasklabError(f"split.json and docs/ disagree: {sorted(listed ^ set(docs))}")
    return split, qs


def check_frozen(root: Path = ROOT) -> None:
    """Refuse benchmark files that differ from ``frozen.json``."""
    frozen = json.loads((root / "frozen.json").read_text())
    now = _hashes(root)
    if now != frozen["files"]:
        changed = sorted(k for k in set(now) | set(frozen["files"]) if now.get(k) != frozen["files"].get(k))
        raise MasklabError(f"the real-document benchmark differs from frozen.json in {', '.join(changed)}: "
                           "it was frozen before the work it judges and must not change")


@lru_cache(maxsize=None)
def load(split: str = "test", root: Path = ROOT) -> list[RealQuestion]:
    """The frozen benchmark's questions of ``split`` (``val``, ``test`` or ``all``)."""
    if split not in (*SPLITS, "all"):
        raise MasklabError(f"unknown split {split!r}; choose from val, test, all")
    check_frozen(root)
    sp, qs = _read(root)
    docs = set(sp["val"]) | set(sp["test"]) if split == "all" else set(sp[split])
    return [q for q in qs if q.doc in docs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m masklab.tasks.realdocs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="validate the files and print counts")
    ap.add_argument("--freeze", action="store_true", help="write frozen.json (the hash of every file)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the benchmark folder (default: the packaged one)")
    a = ap.parse_args(argv)
    split, qs = _read(a.root)
    for s in SPLITS:
        sq = [q for q in qs if q.doc in set(split[s])]
        kinds = {k: sum(q.kind == k for q in sq) for k in KINDS}
        print(f"{s}: {len(split[s])} documents, {len(sq)} questions {kinds}")
    if a.freeze:
        files = _hashes(a.root)
        (a.root / "frozen.json").write_text(json.dumps({"digest": digest(a.root), "files": files}, indent=1) + "\n")
        print("frozen:", digest(a.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
