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
