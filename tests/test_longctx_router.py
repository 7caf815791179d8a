"""Long-context routers (masklab/pretrained/lcrouter.py): trained on evidence labels they
rank the gold sentences above the filler on held-out examples (random labels do not);
the stored router (safetensors + JSON) scores as the trained one; the router's input maps
every token to its sentence. No model: features here are a hashed bag of words plus the
question overlap, the router and the keep rule are the real ones."""

import importlib.util
import random
import zlib
from pathlib import Path

import pytest
import torch

from masklab.pretrained.lcrouter import fit_routers, keep_by_scores, load_routers, question_overlap, question_text, save_routers
from masklab.tasks.longctx import make_examples

SMOL = Path.home() / ".cache" / "masklab" / "models" / "smollm2-135m"


def bow_features(ex, dims: int = 32) -> torch.Tensor:
    """``(N, dims + 1)``: hashed words of each sentence and its question overlap."""
    out = torch.zeros(len(ex.sentences), dims + 1)
    for i, s in enumerate(ex.sentences):
        for w in s.lower().split():
            out[i, zlib.crc32(w.encode()) % dims] += 1
    out[:, dims] = torch.tensor(question_overlap(ex.sentences, question_text(ex)))
    return out


def gold_recall(router, examples, keep: float) -> float:
    hits = 0
    for ex in examples:
        lengths = [len(s.split()) + 1 for s in ex.sentences]
        kept = keep_by_scores(router.score(bow_features(ex)), lengths, keep)
        hits += all(kept[g] for g in ex.gold)
    return hits / len(examples)


@pytest.mark.parametrize("task", ["niah", "multikey"])
def test_router_trained_on_evidence_keeps_gold_and_random_labels_do_not(task):
    train = make_examples(task, 384, 16, seed=1000)  # seeds disjoint from the test seeds
    test = make_examples(task, 384, 10, seed=0)
    feats = [bow_features(ex) for ex in train]
    rng = random.Random(0)
    labels = {"evidence": [ex.gold for ex in train],
              "random": [[rng.randrange(len(ex.sentences))] for ex in train]}
    routers = fit_routers(feats, labels)
    keep = 0.1  # a few sentences out of ~20
    assert gold_recall(routers["evidence"], test, keep) >= 0.9
    assert gold_recall(routers["random"], test, keep) <= 0.5


def test_stored_router_scores_like_the_trained_one(tmp_path):
    train = make_examples("niah", 256, 4, seed=7)
    routers = fit_routers([bow_features(ex) for ex in train], {"evidence": [ex.gold for ex in train]})
    save_routers(tmp_path / "r", routers, {"kinds": ["evidence"], "labelled": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.safetensors"]  # no pickle
    loaded, meta = load_routers(tmp_path / "r")
    X = bow_features(make_examples("niah", 256, 1, seed=0)[0])
    assert torch.equal(loaded["evidence"].score(X), routers["evidence"].score(X)) and meta["labelled"] == 4


def test_keep_by_scores_respects_the_budget():
    scores = torch.tensor([0.1, 3.0, 2.0, -1.0, 1.0])
    lengths = [10, 30, 30, 10, 10]
    assert keep_by_scores(scores, lengths, 0.5) == [False, True, False, False, True]  # 40 of 90: 30 + 10
    assert keep_by_scores(scores, lengths, 0.01) == [False, True, False, False, False]  # the top one always


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None or not (SMOL / "tokenizer.json").exists(),
                    reason="needs the cached SmolLM2 tokenizer (masklab models)")
def test_router_input_maps_tokens_to_their_sentences():
    from transformers import AutoTokenizer

    from masklab.pretrained.lcrouter import router_input

    tok = AutoTokenizer.from_pretrained(str(SMOL))
    ex = make_examples("multikey", 512, 1, seed=3, tokenizer=tok)[0]
    ids, item = router_input(tok, ex.sentences, question_text(ex))
    assert tok.decode(ids[item == -2]).strip() == question_text(ex)
    for i, s in enumerate(ex.sentences):
        assert tok.decode(ids[item == i]).split() == s.split(), i
