"""Several passages pruned for one question within one budget (one :class:`Request`; word
routers without a model, so tokens are words and punctuation marks)."""

from __future__ import annotations

import pytest

from masklab.context import Request, load_router, segment
from masklab.util.errors import MasklabError

BUDGET = (
    "The annual budget was approved by Daniel Reyes. The budget vote was close, said Reyes. "
    "The budget covers the library roof."
)
WEATHER = "It rained all week in Porto. The river rose above the quay. Nobody went out."
TRAIN = "We took the night train north. The train was late. The budget airline was cheaper."


def pruned(passages, question, router="bm25", **budget):
    router = load_router(router) if isinstance(router, str) else router
    return router.prune(Request.of(question, passages, router=router.name, **budget))


def test_the_budget_is_spent_across_passages_not_per_passage():
    out = pruned([WEATHER, BUDGET, TRAIN], "Who approved the annual budget?", keep=0.3)
    assert out.rank[0] == 1  # the passage with the answering unit ranks first
    assert out.passage_kept[0] == []  # the weather passage keeps nothing (a per-passage budget would keep some of it)
    assert 0 in out.passage_kept[1]
    assert "Daniel Reyes" in out.text and "rained" not in out.text
    assert out.kept_tokens <= 0.3 * out.origin_tokens
    assert out.origin_tokens == sum(sum(segment(p).lengths(None)) for p in (WEATHER, BUDGET, TRAIN))
    assert out.ratio == pytest.approx(out.origin_tokens / out.kept_tokens)


def test_text_keeps_passage_boundaries_in_the_original_order():
    out = pruned([TRAIN, BUDGET], "Which train, and who approved the budget?", "lexical", keep=1.0)
    assert out.text == TRAIN + "\n\n" + BUDGET
    assert out.texts == [TRAIN, BUDGET]
    out = pruned([TRAIN, WEATHER, BUDGET], "Was the night train late, and who approved the budget?", target_tokens=21)
    assert out.passage_kept[1] == [] and out.texts[1] == "" and out.passage_kept[0] and out.passage_kept[2]
    assert out.text == out.texts[0] + "\n\n" + out.texts[2]  # in the passages' order, not their rank


def test_target_tokens_caps_the_kept_tokens_and_wins_over_keep():
    passages = [BUDGET, WEATHER, TRAIN]
    for target in (5, 12, 20, 40):
        out = pruned(passages, "Who approved the budget?", keep=1.0, target_tokens=target)
        assert out.to_json()["target_tokens"] == target and out.to_json()["keep"] is None
        assert out.kept_tokens <= target or len(out.kept) == 1
    assert pruned(passages, "Who approved the budget?", target_tokens=10_000).kept_tokens == sum(
        sum(segment(p).lengths(None)) for p in passages
    )


def test_the_top_unit_of_the_top_passage_is_always_kept_with_a_note():
    out = pruned([WEATHER, BUDGET], "Who approved the annual budget?", target_tokens=1)
    assert out.passage_kept == [[], [0]] and out.kept_tokens > 1
    assert any("always kept" in n for n in out.notes)


def test_scores_are_one_call_over_every_unit_so_they_compare_across_passages():
    router = load_router("bm25")
    out = pruned([BUDGET, TRAIN], "Which budget?", router, keep=0.5)
    joined = segment(BUDGET).units + segment(TRAIN).units
    from masklab.context import Document

    want = router.score(Document(units=joined), "Which budget?").tolist()
    assert out.scores == pytest.approx(want)


def test_json_has_the_totals_and_one_row_per_passage():
    out = pruned([WEATHER, BUDGET], "Who approved the budget?", keep=0.25).to_json()
    for key in ("origin_tokens", "compressed_tokens", "ratio", "pruned_text", "kept_fraction", "router_seconds"):
        assert key in out
    rows = out["passages"]
    assert [r["index"] for r in rows] == [0, 1] and sorted(r["rank"] for r in rows) == [0, 1]
    for r, p in zip(rows, (WEATHER, BUDGET)):
        assert r["units"] == len(segment(p).units) and r["tokens"] == sum(segment(p).lengths(None))
        assert r["kept_units"] == len(r["kept"]) and r["kept_tokens"] <= r["tokens"]
    assert sum(r["kept_tokens"] for r in rows) == out["compressed_tokens"]


def test_a_budget_of_zero_is_a_budget():
    req = Request("Who?", BUDGET, threshold=0.0, router="pruner-ctx")  # every unit scoring at least 0
    assert req.threshold == 0.0 and req.fraction is None and req.budget_text() == "threshold 0.0"
    with pytest.raises(MasklabError, match=r"keep must be a fraction in \(0, 1\]"):
        Request("Who?", BUDGET, fraction=0, router="bm25")
    with pytest.raises(MasklabError, match="threshold and target_tokens each set the budget"):
        Request("Who?", BUDGET, tokens=5, threshold=0.0, router="pruner-ctx")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"passages": []}, "non-empty list of strings"),
        ({"passages": [BUDGET, "  \n"]}, "passage 1 of the context is empty"),
        ({"passages": [BUDGET, 3]}, "passage 1 is a int"),
        ({"question": " "}, "question is empty"),
        ({"target_tokens": 0}, "target_tokens must be at least 1, got 0"),
        ({"target_tokens": 2.5}, "whole number of tokens"),
        ({"keep": 0}, r"keep must be a fraction in \(0, 1\]"),
        ({"router": "nope"}, "unknown router 'nope'"),
        ({"threshold": 0.5}, "threshold needs a router that decides how much to keep"),
        ({"keep": "auto"}, "keep auto needs a router that decides how much to keep"),
        ({"unit_tokens": 0}, "unit_tokens must be a whole number"),
        (
            {"options": {"int8": True}},
            r"int8 quantises the pruner's encoder \(pruner, pruner-ctx, pruner-passage\), not bm25",
        ),
    ],
)
def test_bad_requests_are_one_clear_error_when_made(kwargs, match):
    args = {"passages": [BUDGET, WEATHER], "question": "Who?", "router": "bm25", **kwargs}
    with pytest.raises(MasklabError, match=match):
        Request.of(**args)
