"""Fast tests of the pretrained-study pieces that need no model: prompts, SQuAD, routers."""

import json
import random

import pytest
import torch

from masklab.lab.tasks.base import regex_sentences
from masklab.lab.runner import MasklabError
from masklab.lab.tasks.squad import load_squad, normalize, to_item
from masklab.lab.tasks.stale_prompts import ATTRIBUTE_NAMES, distractor_pool, make_prompt, make_prompts, score_answer


def test_prompts_vary_and_spans_point_at_values():
    ps = make_prompts(60, seed=0)
    assert {p.attribute for p in ps} == set(ATTRIBUTE_NAMES)
    assert {p.n_updates for p in ps} == {1, 2, 3}
    assert len({p.entity for p in ps}) > 5 and len({p.distance for p in ps}) > 3
    for p in ps:
        assert len(p.stale_spans) == p.n_updates and len(p.current_spans) == 1
        assert [p.prompt[a:b] for a, b in p.stale_spans + p.current_spans] == p.values
        assert p.current in p.sentences[p.gold[0]] and len(set(p.values)) == len(p.values)
        assert p.query.startswith("\nQuestion:") and p.prompt.endswith(p.query)
        assert len(set(p.sentences)) == len(p.sentences)  # no distractor twice


def test_prompts_are_seeded():
    assert [p.prompt for p in make_prompts(5, seed=3)] == [p.prompt for p in make_prompts(5, seed=3)]
    assert make_prompts(1, seed=3)[0].prompt != make_prompts(1, seed=4)[0].prompt


def test_distractors_are_real_prose_without_values():
    pool = distractor_pool()
    assert len(pool) > 200
    assert all(s.endswith(".") and not any(ch.isdigit() for ch in s) for s in pool)


def test_scoring_exact_match():
    p = make_prompt(random.Random(0), attribute="city", updates=(1, 1))
    stale, cur = p.values
    assert score_answer(f" {cur}.\nQuestion", p) == "current"
    assert score_answer(f" now {cur}", p) == "current"
    assert score_answer(f" {stale}, then", p) == "stale"
    assert score_answer(f" {cur}ville", p) == "other"


def test_regex_sentences():
    text = "Alice lives in Rome. Later, she moved to Oslo! Did she?\n\nNew paragraph here e.g. this"
    assert regex_sentences(text) == [
        "Alice lives in Rome.",
        "Later, she moved to Oslo!",
        "Did she?",
        "New paragraph here e.g. this",
    ]


def _squad(tmp_path, data):
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps(data))
    return path


def test_squad_loader_reads_official_format(tmp_path):
    ctx = "Paris is the capital of France. It has 2 million people. The Seine flows through it."
    data = {
        "version": "1.1",
        "data": [
            {
                "title": "Paris",
                "paragraphs": [
                    {
                        "context": ctx,
                        "qas": [
                            {
                                "id": "q1",
                                "question": "How many people live in Paris?",
                                "answers": [{"text": "2 million", "answer_start": ctx.index("2 million")}],
                            },
                            {
                                "id": "q2",
                                "question": "Which river?",
                                "answers": [{"text": "The Seine", "answer_start": ctx.index("The Seine")}],
                            },
                        ],
                    }
                ],
            }
        ],
    }
    exs = load_squad(_squad(tmp_path, data))
    assert [e.id for e in exs] == ["q1", "q2"] and exs[0].answers == ["2 million"]
    items = [to_item(e) for e in exs]
    assert [it.gold for it in items] == [[1], [2]]
    assert items[0].classify(" 2 million.\nQuestion") == "current"
    assert items[1].classify(" the Seine") == "current" and items[1].classify(" Loire") == "other"
    assert normalize("The  Seine!") == "seine"
    assert len(load_squad(_squad(tmp_path, data), limit=1)) == 1


@pytest.mark.parametrize(
    "bad", ["not json", json.dumps({"version": "1.1"}), json.dumps({"data": [{"paragraphs": [{"qas": [{"id": 1}]}]}]})]
)
def test_squad_loader_rejects_malformed(tmp_path, bad):
    path = tmp_path / "bad.json"
    path.write_text(bad)
    with pytest.raises(MasklabError, match="SQuAD|JSON"):
        load_squad(path)
    with pytest.raises(MasklabError, match="not found"):
        load_squad(tmp_path / "missing.json")


def test_router_learns_separable_labels():
    from masklab.lab.linear_routers import fit_linear

    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 5, generator=g)
    y = (X[:, 2] > 0.8).float()
    r = fit_linear(X, y)
    s = r.score(X)
    assert s[y == 1].min() > s[y == 0].median()
