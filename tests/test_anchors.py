"""The framework anchors of ``masklab realdocs`` (masklab/lab/anchors.py): LangChain's
EmbeddingsFilter ranks as the dense router does (the same cosine of the same embedder: a wrong
wrapper fails), LlamaIndex's SentenceEmbeddingOptimizer keeps the asked share of masklab's
units (and its neighbours), the summary and table of a router without a rank, and the refusal
without the anchors extra."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import needs_dense
from masklab.lab.anchors import ANCHORS, INSTALL, LANGCHAIN, LLAMAINDEX, check, units_in
from masklab.text.document import Document, segment
from masklab.util.errors import MasklabError

try:
    check(ANCHORS)
    HAVE_ANCHORS = True
except MasklabError:
    HAVE_ANCHORS = False
needs_anchors = pytest.mark.skipif(not HAVE_ANCHORS, reason=f"anchors extra not installed: {INSTALL}")

UNITS = [
    "The committee met on Tuesday to discuss the annual budget report.",
    "Copies may be handed on for a fee covering the physical transfer.",
    "The report on the budget was discussed again by the committee on Friday.",
    "Weather in the region stayed mild all week.",
    "A fee may be charged for the act of transferring a copy.",
    "Nobody objected to the minutes of the previous meeting.",
]
QUESTION = "Is it allowed to ask for money when I give someone a copy?"

TEXT = "\n\n".join(
    " ".join(f"Paragraph {p} sentence {s} talks about {topic}." for s in range(4))
    for p, topic in enumerate(
        ["rivers and lakes", "the budget vote", "copy fees and money", "train timetables", "garden birds"]
    )
)


@needs_anchors
@needs_dense
def test_the_langchain_anchor_ranks_exactly_as_the_dense_router():
    from masklab.lab.anchors import load_anchor
    from masklab.context.routers import load_router

    doc = Document(units=UNITS)
    dense = load_router("dense").score(doc, QUESTION)
    anchor = load_anchor(LANGCHAIN)
    lc = anchor.score(doc, QUESTION)
    assert torch.allclose(lc.float(), dense.float(), atol=1e-5)
    assert torch.argsort(lc, descending=True).tolist() == torch.argsort(dense, descending=True).tolist()
    d = anchor.default(doc, QUESTION, [[1]], [10] * len(UNITS))
    assert d == {"k": 20, "units": len(UNITS), "kept": True, "kept_fraction": 1.0}  # k=20 > 6 units: all


@needs_anchors
@needs_dense
def test_the_llamaindex_anchor_keeps_the_asked_share_of_masklabs_units_and_their_neighbours():
    from masklab.lab.anchors import load_anchor
    from masklab.context.routers import load_router

    doc = segment(TEXT)
    n = len(doc.units)
    assert n == 20
    anchor = load_anchor(LLAMAINDEX)
    assert anchor.units_of(TEXT) == doc.units  # its tokenizer_fn: masklab's units
    dense = load_router("dense").score(doc, "How much money is a copy?")
    for keep in (0.1, 0.25):
        text = anchor.optimize(TEXT, "How much money is a copy?", keep)
        top = torch.argsort(dense, descending=True).tolist()[: int(keep * n)]  # the asked share of the units
        windows = [list(range(max(i - 1, 0), min(i + 2, n))) for i in top]  # and one either side (its default)
        assert text == " ".join(" ".join(doc.units[j] for j in w) for w in windows)
        assert units_in(text, doc.units) == {j for w in windows for j in w}
    rec, texts = anchor.evaluate(doc, "How much money is a copy?", [[int(dense.argmax())]], doc.lengths(None), [0.1])
    assert rec["0.1"]["kept"] and rec["0.1"]["top"] == 2 and "rank" not in rec and "rr" not in rec
    assert 0.1 < rec["0.1"]["kept_fraction"] <= 0.3 and rec["0.1"]["text_fraction"] >= rec["0.1"]["kept_fraction"]


def test_units_are_found_whole_and_not_inside_a_longer_kept_unit():
    units = ["Yes.", "He said Yes. Then left.", "Other.", "Yes."]
    assert units_in("He said Yes. Then left.", units) == {1}
    assert units_in("Other. Yes.", units) == {0, 2, 3}  # the same text: both copies are in
    assert units_in("Others.", units) == set()


def test_a_router_without_a_rank_is_summarised_without_mrr():
    from masklab.lab.realdocs import markdown, summarise

    rows = [
        {
            "id": str(i),
            "kind": "single",
            "bm25": {"router_seconds": 0.0, "rr": 0.5, "rank": 2, "0.1": {"kept": True, "kept_fraction": 0.1}},
            LLAMAINDEX: {"router_seconds": 0.0, "0.1": {"kept": bool(i % 2), "kept_fraction": 0.3}},
            LANGCHAIN: {
                "router_seconds": 0.0,
                "rr": 1.0,
                "rank": 1,
                "0.1": {"kept": True, "kept_fraction": 0.1},
                "default": {"k": 20, "units": 20, "kept": True, "kept_fraction": 0.4},
            },
        }
        for i in range(10)
    ]
    summary = summarise(rows, ["bm25", LANGCHAIN, LLAMAINDEX], [0.1])
    by = {(s["task"], s["method"]): s for s in summary}
    li = by[("all", LLAMAINDEX)]
    assert (
        "mrr" not in li
        and "p_mrr_vs_bm25" not in li
        and li["kept@10"] == 0.5
        and li["fraction@10"] == pytest.approx(0.3)
    )
    assert by[("all", LANGCHAIN)]["default_kept"] == 1.0 and by[("all", LANGCHAIN)]["default_units"] == 20
    table = markdown(
        {
            "split": "val",
            "model": "m",
            "benchmark": "b",
            "summary": summary,
            "config": {"keep": [0.1], "answers": False},
        }
    )
    assert f"| all | {LLAMAINDEX} | 10 | - |" in table and "(0.30 of tokens)" in table
    assert f"{LANGCHAIN} at its default k=20 (all)" in table


def test_a_missing_anchors_extra_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "langchain_classic", None)  # import langchain_classic: ImportError
    with pytest.raises(MasklabError, match=r"langchain-classic.*masklab\[anchors\]"):
        check([LANGCHAIN])
    check(["bm25"])  # a router is no anchor: nothing to check
