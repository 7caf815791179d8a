"""The real-document benchmark's loader: the frozen files, their validation and the answer check."""

import json
import shutil

import pytest

from masklab.util.errors import MasklabError
from masklab.lab.tasks import realdocs


def test_the_packaged_benchmark_is_frozen_and_complete():
    val, test = realdocs.load("val"), realdocs.load("test")
    assert len(val) + len(test) >= 100
    assert not {q.doc for q in val} & {q.doc for q in test}  # split by document
    assert sum(q.kind != "single" for q in val + test) >= 25
    for q in val + test:
        for a, b in q.spans():
            assert q.text[a:b] in q.evidence


def test_the_training_corpus_is_frozen_and_shares_no_document_with_the_benchmark():
    train, val = realdocs.load("train", realdocs.CORPUS), realdocs.load("val", realdocs.CORPUS)
    bench = {q.doc for q in realdocs.load("all")}
    corpus_texts = {q.text for q in train + val}
    assert not ({q.doc for q in train + val} & bench) and not corpus_texts & {q.text for q in realdocs.load("all")}
    assert not {q.doc for q in train} & {q.doc for q in val}
    assert sum(q.kind == "two" for q in train) >= 250 and sum(q.kind == "latest" for q in train) >= 35
    assert len(train) >= 3000 and sum(q.kind in realdocs.MULTI_UNIT for q in train) >= 0.4 * len(train)
    assert sum(q.kind == "bridge" for q in val) >= 30  # one hop against two is measured on them


def test_the_third_test_split_is_mostly_evidence_across_units_on_documents_no_corpus_question_reads():
    test3 = realdocs.load("test3")
    corpus = realdocs.load("all", realdocs.CORPUS)
    assert len(test3) >= 250 and sum(q.kind in realdocs.MULTI_UNIT for q in test3) >= 0.6 * len(test3)
    assert not {d for q in test3 for d in q.sources} & {d for q in corpus for d in q.sources}
    multi = [q for q in test3 if q.kind == "multi"]
    assert multi and all(len(q.passages) >= 5 for q in multi)


@pytest.fixture
def copy(tmp_path):
    root = tmp_path / "realdocs"
    shutil.copytree(realdocs.ROOT, root)
    return root


def test_a_changed_file_is_refused(copy):
    realdocs.check_frozen(copy)
    doc = next((copy / "docs").glob("*.txt"))
    doc.write_text(doc.read_text() + "\nan added line\n")
    with pytest.raises(MasklabError, match="differs from frozen.json"):
        realdocs.check_frozen(copy)


def test_evidence_must_occur_once_in_its_document(copy):
    path = next((copy / "questions").glob("*.jsonl"))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["evidence"] = ["this sentence is in no document at all"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(MasklabError, match="occurs 0 times"):
        realdocs._read(copy)


def test_is_correct_matches_an_answer_anywhere_case_and_space_insensitively():
    q = realdocs.RealQuestion("x-01", "x", "single", "How long?", ("e",), ("30  days",), "e")
    assert q.is_correct("Within 30 DAYS of notice.")
    assert not q.is_correct("Within 3 days.")


def _writer(root, docs: dict, rows: list[dict], split: str = "train") -> None:
    """A writer's folder: ``docs`` name -> text, ``rows`` question lines (multi ones in their own file)."""
    (root / "docs").mkdir(parents=True)
    (root / "questions").mkdir()
    for name, text in docs.items():
        (root / "docs" / f"{name}.txt").write_text(text)
    for r in rows:
        f = root / "questions" / (f"multi-{root.name}.jsonl" if r["kind"] == "multi" else f"{r['doc']}.jsonl")
        with open(f, "a") as out:
            out.write(json.dumps(r) + "\n")
    spec = {
        name: {"kind": "README", "source": f"/x/{name}", "package": "p", "terms": "t", "split": split} for name in docs
    }
    (root / "sources.json").write_text(json.dumps({"chars": 9000, "docs": spec}))


DOCS = {
    f"d{i}": f"Tool {i} keeps its settings in file{i}.conf.\n\nThe file{i}.conf format is INI with "
    f"sections number {i}.\n\nUnrelated words {i}.\n"
    for i in range(6)
}


def test_bridge_and_multi_passage_questions_load_from_merged_writers(tmp_path):
    import subprocess
    import sys

    bridge = {
        "id": "d0-01",
        "doc": "d0",
        "kind": "bridge",
        "question": "Which syntax does tool 0's settings use?",
        "evidence": ["keeps its settings in file0.conf", "format is INI with sections number 0"],
        "answers": ["INI"],
        "negatives": ["Unrelated words 0."],
    }
    passages = [{"doc": d, "text": t[: t.index("\n\nUnrelated")]} for d, t in DOCS.items()]
    multi = {
        "id": "multi-w-01",
        "kind": "multi",
        "question": "Which syntax do tool 1 and 2 use?",
        "passages": passages,
        "evidence": ["file1.conf format is INI", "file2.conf format is INI"],
        "answers": ["INI"],
    }
    _writer(tmp_path / "w", DOCS, [bridge, multi])
    into = tmp_path / "corpus"
    into.mkdir()
    script = realdocs.DATA.parent.parent / "scripts" / "merge_writers.py"
    run = subprocess.run(
        [sys.executable, str(script), "--into", str(into), str(tmp_path / "w")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    _, qs = realdocs._read(into)
    by_id = {q.id: q for q in qs}
    assert by_id["d0-01"].negatives == ("Unrelated words 0.",) and by_id["d0-01"].sources == ("d0",)
    m = by_id["multi-w-01"]
    assert m.sources == tuple(DOCS) and m.text.count("file1.conf format is INI") == 1
    assert [m.text[a:b] for a, b in m.spans()] == list(m.evidence)
    again = subprocess.run(
        [sys.executable, str(script), "--into", str(into), str(tmp_path / "w")], capture_output=True, text=True
    )
    assert again.returncode != 0 and "already" in again.stderr  # a writer cannot overwrite another's files


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.update(passages=m["passages"][:4]), "5-10 passages"),
        (lambda m: m.update(evidence=["file1.conf format is INI", "keeps its settings in file1.conf"]), "two passages"),
        (lambda m: m["passages"][0].update(text="not in the document"), "no excerpt"),
        (lambda m: m.update(kind="bridge", doc="d0", evidence=["file0.conf format is INI"]), "two evidence"),
    ],
)
def test_a_bad_multi_passage_or_bridge_line_is_refused(tmp_path, change, message):
    passages = [{"doc": d, "text": t} for d, t in DOCS.items()]
    m = {
        "id": "m-01",
        "kind": "multi",
        "question": "q?",
        "passages": passages,
        "answers": ["INI"],
        "evidence": ["file1.conf format is INI", "file2.conf format is INI"],
    }
    change(m)
    _writer(tmp_path, DOCS, [m])
    (tmp_path / "split.json").write_text(json.dumps({"train": list(DOCS)}))
    with pytest.raises(MasklabError, match=message):
        realdocs._read(tmp_path)
