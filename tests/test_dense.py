"""The dense routers: sentence embeddings of the packaged all-MiniLM-L6-v2, their cache, the
embedder option's refusals, bm25+dense, and the second test split they are reported on."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import needs_dense
from masklab.lab.realdocs import choose
from masklab.text.document import Document
from masklab.util.errors import MasklabError

# A paraphrased question: the answer shares no content word with it; a distractor shares several.
UNITS = [
    "The committee met on Tuesday to discuss the annual budget report.",
    "Copies may be handed on for a fee covering the physical transfer.",
    "The report on the budget was discussed again by the committee on Friday.",
    "Weather in the region stayed mild all week.",
]
QUESTION = "Is it allowed to ask for money when I give someone a copy?"


@needs_dense
def test_dense_ranks_a_paraphrase_first_where_bm25_cannot():
    from masklab.context.routers import load_router

    doc = Document(units=UNITS)
    dense = load_router("dense").score(doc, QUESTION)
    bm25 = load_router("bm25").score(doc, QUESTION)
    assert int(dense.argmax()) == 1
    assert float(bm25[1]) == 0.0  # no shared word: BM25 cannot find it


@needs_dense
def test_units_are_embedded_once_per_document_and_embedder():
    from masklab.context.embedder import load_embedder

    emb = load_embedder()
    units = [f"Unit {i} of a document never seen before: {torch.rand(1).item()}" for i in range(3)]
    hits, misses = emb.hits, emb.misses
    a = emb.units(units)
    b = emb.units(list(units))
    assert emb.misses == misses + 1 and emb.hits == hits + 1 and b is a
    assert a.shape == (3, emb.dim) and torch.allclose(a.norm(dim=1), torch.ones(3), atol=1e-4)
    assert not torch.equal(emb.units(units[:2]), a[:2]) or emb.misses == misses + 2  # other units: embedded anew


@needs_dense
def test_bm25_dense_adds_both_z_scores():
    from masklab.context.routers import load_router
    from masklab.context.routers.fused import fuse

    doc = Document(units=UNITS)
    fused = load_router("bm25+dense")
    assert (fused.how, fused.weight) == ("z", 2.0)
    want = fuse(load_router("bm25").score(doc, QUESTION), load_router("dense").score(doc, QUESTION), "z", 2.0)
    assert torch.allclose(fused.score(doc, QUESTION), want)


def test_an_embedder_that_is_no_model_folder_is_one_clear_error(tmp_path):
    from masklab.context.embedder import check_folder
    from masklab.context.routers import load_router

    with pytest.raises(MasklabError, match="does not exist"):
        check_folder(tmp_path / "missing")
    with pytest.raises(MasklabError, match="not a sentence-transformers model folder"):
        check_folder(tmp_path)
    (tmp_path / "modules.json").write_text("{not json")
    with pytest.raises(MasklabError, match="not JSON"):
        check_folder(tmp_path)
    with pytest.raises(MasklabError, match="embed sentences"):
        load_router("bm25", embedder=str(tmp_path))


def test_compress_refuses_a_bad_embedder_before_the_model_loads(tmp_path, capsys):
    from masklab.cli import main

    doc = tmp_path / "d.txt"
    doc.write_text("One sentence. Another one.")
    assert (
        main(
            [
                "compress",
                "--context",
                str(doc),
                "--question",
                "Which?",
                "--router",
                "dense",
                "--embedder",
                str(tmp_path / "nowhere"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("masklab: error:") and "does not exist" in err[0]
    assert (
        main(
            ["compress", "--context", str(doc), "--question", "Which?", "--router", "bm25", "--embedder", str(tmp_path)]
        )
        == 2
    )
    assert "--embedder is for" in capsys.readouterr().err


def test_the_dense_fusion_must_keep_as_often_as_both_parts():
    grid = [
        {"how": "bm25", "weight": 0, "mrr": 0.3, "kept": 0.5},
        {"how": "dense", "weight": 0, "mrr": 0.4, "kept": 0.6},
        {"how": "z", "weight": 1, "mrr": 0.45, "kept": 0.55},
        {"how": "z", "weight": 2, "mrr": 0.42, "kept": 0.6},
    ]
    assert choose(grid)["weight"] == 1  # against bm25 alone, the best MRR wins
    assert choose(grid, ("bm25", "dense"))["weight"] == 2  # must keep as often as dense too
    grid[3]["kept"] = 0.59
    assert choose(grid, ("bm25", "dense"))["how"] == "dense"  # none qualifies: the better part alone


def test_the_second_test_split_is_frozen_and_apart_from_the_first():
    from masklab.lab.tasks import realdocs

    qs = realdocs.load("test2")
    first = {q.doc for q in realdocs.load("val") + realdocs.load("test")}
    assert len(qs) >= 150 and len({q.doc for q in qs}) >= 12 and not first & {q.doc for q in qs}
    assert realdocs.benchmark_digest("test2") == json.loads((realdocs.ROOT2 / "frozen.json").read_text())["digest"]
    assert realdocs.benchmark_digest("test2") != realdocs.benchmark_digest("test")
    assert sum(map(realdocs.overlap, qs)) / len(qs) <= 0.15


def test_a_changed_file_of_the_second_split_is_refused(tmp_path):
    import shutil

    from masklab.lab.tasks import realdocs

    root = tmp_path / "rd2"
    shutil.copytree(realdocs.ROOT2, root)
    realdocs.load.cache_clear()
    realdocs.load("test", root)
    q = root / "questions" / "grep-man.jsonl"
    q.write_text(q.read_text().replace("?", "??", 1))
    realdocs.load.cache_clear()
    with pytest.raises(MasklabError, match="differs from frozen.json"):
        realdocs.load("test", root)


def test_overlap_counts_the_question_words_found_in_the_evidence():
    from masklab.lab.tasks.realdocs import RealQuestion, overlap

    q = RealQuestion(
        "d-01",
        "d",
        "single",
        "Which option compresses the archive?",
        ("Use -z to compress it.",),
        ("-z",),
        "Use -z to compress it.",
    )
    assert overlap(q) == 0.0  # "compresses" is not "compress"; "option", "archive" are absent
    q2 = RealQuestion(
        "d-02",
        "d",
        "single",
        "Does the option compress?",
        ("The option does compress.",),
        ("-z",),
        "The option does compress.",
    )
    assert overlap(q2) == 1.0
