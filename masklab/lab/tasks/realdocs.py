"""The real-document benchmark: real files (licences, FAQs, changelogs, man pages, Python's
documentation, READMEs) with questions a user would ask and their answering sentences
marked by text (format: ``masklab/data/realdocs/FORMAT.md``; sources and licences:
``SOURCES.md``).

``load(split)`` returns :class:`RealQuestion` s (``split``: ``val``, ``test``, ``test2``, ``test3``
or ``all``; ``test2`` and ``test3`` are test splits written later, in ``masklab/data/realdocs2``
and ``masklab/data/realdocs3``: ``test3`` mostly of questions whose evidence spans units or passages);
it checks every file against ``frozen.json`` (the benchmark was frozen before the router
work it judges), so a result that names :func:`digest` names exactly these questions. The
training corpus of the pruner (``masklab/data/corpus``, splits ``train`` and ``val``) has the
same format and is read with ``load(split, CORPUS)``.

``python -m masklab.lab.tasks.realdocs --root DIR --check`` validates a folder's files (every
evidence string occurs once in its document) and prints how many of each question's content
words its answering sentences share (:func:`overlap`); ``--rebuild`` writes ``docs/`` anew
from the machine's own files named in ``sources.json`` and fails where one differs from
``frozen.json``; ``--freeze`` writes ``frozen.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from masklab.util.errors import MasklabError

DATA = Path(__file__).resolve().parents[2] / "data"  # masklab/data
ROOT, ROOT2, ROOT3, CORPUS = DATA / "realdocs", DATA / "realdocs2", DATA / "realdocs3", DATA / "corpus"
KINDS = ("single", "two", "bridge", "comparison", "latest", "multi")
MULTI_UNIT = ("two", "bridge", "comparison", "latest", "multi")  # kinds whose evidence spans units (or passages)
SPLITS = ("val", "test", "test2", "test3")
WHERE = {
    "val": (ROOT, "val"),
    "test": (ROOT, "test"),
    "test2": (ROOT2, "test"),
    "test3": (ROOT3, "test"),
    "corpus-val": (CORPUS, "val"),
}  # split -> (folder, its split); corpus-val: the training corpus's val
PASSAGE_GAP = "\n\n"  # between the passages of a ``multi`` question's text


@dataclass(frozen=True)
class RealQuestion:
    """One question about one real document; ``evidence``/``stale``/``negatives``: exact
    substrings of ``text`` (the answering sentences; the older statements of a ``latest``
    fact; units that share the question's words but do not answer). A ``multi`` question
    is asked over several passages of different documents: ``passages`` holds them
    ``(doc, text)`` in order, ``text`` is their texts joined by :data:`PASSAGE_GAP` and
    ``doc`` is the question's own id."""

    id: str
    doc: str
    kind: str
    question: str
    evidence: tuple[str, ...]
    answers: tuple[str, ...]
    text: str = field(repr=False)
    stale: tuple[str, ...] = ()
    negatives: tuple[str, ...] = ()
    passages: tuple[tuple[str, str], ...] = ()

    @property
    def sources(self) -> tuple[str, ...]:
        """The documents the question reads."""
        return tuple(d for d, _ in self.passages) or (self.doc,)

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


def answering_units(doc, spans: list[tuple[int, int]]) -> list[list[int]]:
    """For each evidence span, the units of ``doc`` that overlap it."""
    return [[i for i, (a, b) in enumerate(doc.spans) if a < e and s < b] for s, e in spans]


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
            missing = {
                "id",
                "kind",
                "question",
                "evidence",
                "answers",
                "passages" if row.get("kind") == "multi" else "doc",
            } - set(row)
            if missing:
                raise MasklabError(f"{where}: missing {', '.join(sorted(missing))}")
            if row["kind"] not in KINDS:
                raise MasklabError(f"{where}: kind {row['kind']!r} is not one of {', '.join(KINDS)}")
            q = _question(row, docs, where)
            for which in ("evidence", "stale", "negatives"):
                for s in getattr(q, which):
                    if q.text.count(s) != 1:
                        raise MasklabError(
                            f"{where}: {which} string occurs {q.text.count(s)} times in {q.doc}, not once: {s[:60]!r}"
                        )
            if not q.evidence or not q.answers:
                raise MasklabError(f"{where}: evidence and answers must not be empty")
            if q.kind in MULTI_UNIT and q.kind != "latest" and len(q.evidence) < 2:
                raise MasklabError(f"{where}: a {q.kind!r} question needs two evidence strings")
            if q.kind == "latest" and not q.stale:
                raise MasklabError(f"{where}: a 'latest' question needs its older statements in 'stale'")
            qs.append(q)
    ids = [q.id for q in qs]
    if len(set(ids)) != len(ids):
        raise MasklabError("question ids are not unique")
    listed = set().union(*split.values())
    if sum(len(set(v)) for v in split.values()) != len(listed):
        raise MasklabError("a document is in more than one split")
    if listed != set(docs):
        raise MasklabError(f"split.json and docs/ disagree: {sorted(listed ^ set(docs))}")
    return split, qs


def _question(row: dict, docs: dict[str, str], where: str) -> RealQuestion:
    """The :class:`RealQuestion` of one checked line; a ``multi`` line's passages must be
    5-10 exact, unique excerpts of different documents, its evidence in two of them."""
    extra = {k: tuple(row.get(k, ())) for k in ("stale", "negatives")}
    common = (row["id"], row["kind"], row["question"], tuple(row["evidence"]), tuple(row["answers"]))
    if row["kind"] != "multi":
        if row["doc"] not in docs:
            raise MasklabError(f"{where}: no document docs/{row['doc']}.txt")
        i, k, question, ev, ans = common
        return RealQuestion(i, row["doc"], k, question, ev, ans, docs[row["doc"]], **extra)
    ps = [(p.get("doc"), p.get("text", "")) for p in row["passages"]]
    if not 5 <= len(ps) <= 10 or len({d for d, _ in ps}) != len(ps):
        raise MasklabError(f"{where}: a 'multi' question reads 5-10 passages of different documents")
    for d, t in ps:
        if d not in docs or docs[d].count(t) != 1 or not t:
            raise MasklabError(f"{where}: a passage is no excerpt found once in docs/{d}.txt: {t[:60]!r}")
    if sum(any(e in t for e in row["evidence"]) for _, t in ps) < 2:
        raise MasklabError(f"{where}: a 'multi' question's evidence lies in at least two passages")
    i, k, question, ev, ans = common
    return RealQuestion(i, i, k, question, ev, ans, PASSAGE_GAP.join(t for _, t in ps), passages=tuple(ps), **extra)


def question_document(q: RealQuestion, tokenizer):
    """The question's text cut as the product cuts it (:func:`~masklab.text.document.segment`), each unit
    knowing its passage where the question reads several (a ``multi`` question's passages, in order)."""
    from masklab.text.document import segment

    doc = segment(q.text, tokenizer)
    if q.passages:
        ends, at = [], 0
        for _, text in q.passages:
            at += len(text)
            ends.append(at)
            at += len(PASSAGE_GAP)
        doc.passage_of = [next(p for p, e in enumerate(ends) if a < e) for a, _ in doc.spans]
    return doc


def check_frozen(root: Path = ROOT) -> None:
    """Refuse benchmark files that differ from ``frozen.json``."""
    frozen = json.loads((root / "frozen.json").read_text())
    now = _hashes(root)
    if now != frozen["files"]:
        changed = sorted(k for k in set(now) | set(frozen["files"]) if now.get(k) != frozen["files"].get(k))
        raise MasklabError(
            f"the real-document benchmark differs from frozen.json in {', '.join(changed)}: "
            "it was frozen before the work it judges and must not change"
        )


@lru_cache(maxsize=None)
def load(split: str = "test", root: Path | None = None) -> list[RealQuestion]:
    """The frozen questions of ``split``: of the benchmark (``val``, ``test``, ``test2`` or
    ``all`` of them) or, with ``root``, of that folder's ``split.json`` (``all``: every split)."""
    if root is None:
        if split == "all":
            return [q for s in SPLITS for q in load(s)]
        if split not in WHERE:
            raise MasklabError(f"unknown split {split!r}; choose from {', '.join(WHERE)}, all")
        root, split = WHERE[split]
    check_frozen(root)
    sp, qs = _read(root)
    if split != "all" and split not in sp:
        raise MasklabError(f"unknown split {split!r} in {root}; choose from {', '.join(sp)}, all")
    docs = set().union(*sp.values()) if split == "all" else set(sp[split])
    return [q for q in qs if set(q.sources) <= docs]


def benchmark_digest(split: str) -> str:
    """:func:`digest` of the folder that holds ``split`` (``val``, ``test``, ``test2``, ``test3``)."""
    return digest(WHERE[split][0])


CONTENT = re.compile(r"[a-z0-9][a-z0-9_+.-]*[a-z0-9]|[a-z0-9]")


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` less English stop words (bm25s's list)."""
    from bm25s.stopwords import STOPWORDS_EN

    return {w for w in CONTENT.findall(text.lower()) if w not in STOPWORDS_EN}


def overlap(q: RealQuestion) -> float:
    """The share of the question's content words found in its answering sentences (a
    paraphrased question shares few)."""
    words = content_words(q.question)
    found = content_words(" ".join(q.evidence))
    return len(words & found) / max(1, len(words))


def extract(source: str) -> str:
    """The text of one ``sources.json`` source: ``man:NAME`` (the page at 80 columns, as
    ``MANWIDTH=80 man NAME | col -bx``), ``pydoc:TOPIC`` (Python's topic help) or a file
    path (gunzipped when it ends in ``.gz``; a byte that is not UTF-8 becomes U+FFFD)."""
    import gzip
    import os
    import subprocess

    if source.startswith("man:"):
        env = {**os.environ, "MANWIDTH": "80", "MAN_KEEP_FORMATTING": "", "LC_ALL": "C.UTF-8"}
        page = subprocess.run(["man", source[4:]], env=env, capture_output=True, check=True).stdout
        return subprocess.run(["col", "-bx"], input=page, capture_output=True, check=True).stdout.decode()
    if source.startswith("pydoc:"):
        import pydoc_data.topics

        return pydoc_data.topics.topics[source[6:]]
    data = Path(source).read_bytes()
    return (gzip.decompress(data) if source.endswith(".gz") else data).decode("utf-8", errors="replace")


def cut(text: str, chars: int) -> str:
    """``text`` whole if it has at most ``chars`` characters, else its prefix up to the last
    blank line before ``chars`` (a section boundary)."""
    if len(text) <= chars:
        return text
    end = text.rfind("\n\n", 0, chars)
    return text[: end + 1] if end > 0 else text[:chars]


def rebuild(root: Path) -> list[str]:
    """Write ``root/docs`` from the files ``root/sources.json`` names, each cut at its own
    ``chars`` where it has one, else the file's (and ``split.json`` where none exists); the documents that
    differ from ``frozen.json`` (none when the machine's files are the ones frozen)."""
    spec = json.loads((root / "sources.json").read_text())
    (root / "docs").mkdir(exist_ok=True)
    for name, d in spec["docs"].items():
        (root / "docs" / f"{name}.txt").write_text(
            cut(extract(d["source"]), d.get("chars", spec["chars"])), encoding="utf-8"
        )
    if not (root / "split.json").exists():
        split: dict[str, list[str]] = {}
        for name, d in spec["docs"].items():
            split.setdefault(d["split"], []).append(name)
        (root / "split.json").write_text(json.dumps(split, indent=1) + "\n")
    frozen = root / "frozen.json"
    if not frozen.exists():
        return []
    old, now = json.loads(frozen.read_text())["files"], _hashes(root)
    return sorted(k for k in now if k.startswith("docs/") and old.get(k) != now[k])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m masklab.lab.tasks.realdocs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="validate the files and print counts and word overlap")
    ap.add_argument(
        "--rebuild",
        action="store_true",
        help="write docs/ from the machine's files (sources.json) and fail where one differs from frozen.json",
    )
    ap.add_argument("--freeze", action="store_true", help="write frozen.json (the hash of every file)")
    ap.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help=f"the benchmark folder (default: the packaged one; also {ROOT2} and {CORPUS})",
    )
    a = ap.parse_args(argv)
    if a.rebuild:
        changed = rebuild(a.root)
        if changed:
            raise SystemExit(f"masklab: error: rebuilt documents differ from frozen.json: {', '.join(changed)}")
    split, qs = _read(a.root)
    for s, names in split.items():
        sq = [q for q in qs if set(q.sources) <= set(names)]
        kinds = {k: n for k in KINDS if (n := sum(q.kind == k for q in sq))}
        multi = sum(q.kind in MULTI_UNIT for q in sq) / max(1, len(sq))
        share = sum(map(overlap, sq)) / max(1, len(sq))
        print(
            f"{s}: {len(names)} documents, {len(sq)} questions {kinds}, multi-unit share {multi:.2f}, mean "
            f"content-word overlap {share:.2f}, {sum(bool(q.negatives) for q in sq)} with hard negatives"
        )
    if a.check:
        for q in sorted(qs, key=overlap, reverse=True)[:10]:
            print(f"  overlap {overlap(q):.2f}  {q.id}: {q.question}")
    if a.freeze:
        files = _hashes(a.root)
        (a.root / "frozen.json").write_text(json.dumps({"digest": digest(a.root), "files": files}, indent=1) + "\n")
        print("frozen:", digest(a.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def speed_document(tokens: int, tokenizer, name: str = "pydoc-execmodel", split: str = "test2"):
    """``(doc, questions)``: the leading units of benchmark document ``name`` up to ``tokens``
    tokens of ``tokenizer`` (a :class:`~masklab.text.document.Document`) and the split's questions
    about it: the document the speed benchmarks time."""
    from masklab.text.document import Document, segment

    qs = [q for q in load(split) if q.doc == name]
    full = segment(qs[0].text, tokenizer)
    lengths, n = full.lengths(tokenizer), 0
    while n < len(lengths) and sum(lengths[: n + 1]) <= tokens:
        n += 1
    return Document(units=full.units[:n], spans=full.spans[:n], source=full.source), [q.question for q in qs]
