"""Trained routers (masklab/context/routers/features.py): trained on evidence labels they
rank the gold sentences above the filler on held-out examples (random labels do not);
the stored router (safetensors + JSON) scores as the trained one; the router's input maps
every token to its sentence. No model: features here are a hashed bag of words plus the
question overlap, the router and the keep rule are the real ones."""

import random
import zlib

import pytest
import torch

from conftest import needs_smol
from masklab.context.routers.lexical import question_overlap
from masklab.text.selection import select
from masklab.context.routers.features import bm25_scores, hop, load_routers, superseded
from masklab.lab.linear_routers import fit_routers, save_routers
from masklab.lab.tasks.longctx import make_examples


def bow_features(ex, dims: int = 32, recency: bool = False) -> torch.Tensor:
    """``(N, dims + 1)``: hashed words of each sentence and its question overlap (``recency``:
    ``(N, dims + 2)``, and the overlap a later sentence matches too, as ``early_features``)."""
    out = torch.zeros(len(ex.sentences), dims + 1 + recency)
    for i, s in enumerate(ex.sentences):
        for w in s.lower().split():
            out[i, zlib.crc32(w.encode()) % dims] += 1
    overlap = question_overlap(ex.sentences, ex.question)
    out[:, dims] = torch.tensor(overlap)
    if recency:
        out[:, dims + 1] = torch.tensor(superseded(overlap))
    return out


def gold_recall(router, examples, keep: float) -> float:
    hits = 0
    for ex in examples:
        lengths = [len(s.split()) + 1 for s in ex.sentences]
        kept = select(router.score(bow_features(ex)), lengths, keep)
        hits += all(g in kept for g in ex.gold)
    return hits / len(examples)


@pytest.mark.parametrize("task", ["niah", "multikey"])
def test_router_trained_on_evidence_keeps_gold_and_random_labels_do_not(task):
    train = make_examples(task, 384, 16, seed=1000)  # seeds disjoint from the test seeds
    test = make_examples(task, 384, 10, seed=0)
    feats = [bow_features(ex) for ex in train]
    rng = random.Random(0)
    labels = {"evidence": [ex.gold for ex in train], "random": [[rng.randrange(len(ex.sentences))] for ex in train]}
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


def stale_statements(ex) -> list[int]:
    """The earlier statements of the asked key (as well matched by the question as the gold)."""
    overlap = question_overlap(ex.sentences, ex.question)
    return [i for i, o in enumerate(overlap) if o == max(overlap) and i not in ex.gold]


@pytest.mark.parametrize("recency", [True, False])
def test_stale_router_drops_stale_statements_only_with_evidence_labels_and_recency(recency):
    """Evidence labels (the latest statement) + the ``superseded`` feature: the router keeps
    the gold and drops every stale statement at its decision boundary. Trained on the first
    statement instead (what the model reads most when it answers stale), or without the
    feature (a per-sentence score cannot see which statement is the latest), it does not."""
    train = make_examples("stale", 384, 16, seed=1000)
    test = make_examples("stale", 384, 10, seed=0)
    assert all(len(stale_statements(ex)) == 2 for ex in test)  # 2 updates: the first statement + 1 stale update
    routers = fit_routers(
        [bow_features(ex, recency=recency) for ex in train],
        {"evidence": [ex.gold for ex in train], "first": [stale_statements(ex)[:1] for ex in train]},
    )

    def clean(kind):  # gold kept, no stale statement kept
        hits = 0
        for ex in test:
            lengths = [len(s.split()) + 1 for s in ex.sentences]
            kept = select(routers[kind].score(bow_features(ex, recency=recency)), lengths, 0.25, fill=False)
            hits += all(g in kept for g in ex.gold) and not any(i in kept for i in stale_statements(ex))
        return hits / len(test)

    assert clean("first") <= 0.2
    if recency:
        assert clean("evidence") >= 0.9
    else:
        assert clean("evidence") <= 0.5


def test_superseded_is_the_overlap_a_later_sentence_matches():
    assert superseded([0.0, 1.0, 0.2, 1.0, 0.5, 0.0]) == [0.0, 1.0, 0.2, 0.5, 0.0, 0.0]


def test_hop_points_from_a_chains_link_to_the_fact_it_names():
    units = [
        "The harbour opens at dawn.",
        "The violin of Priya is kept in the same place as the old map of Tomas.",  # the link (the anchor)
        "Nobody moves the old map of Tomas from the attic trunk.",  # the fact it points to
        "You will find the logbook of Anna in the boathouse.",  # another key's fact
        "The violin of Priya sounds sweet in the evening.",
    ]  # matches the question, not the link
    question = "Where is the violin of Priya kept?"
    ov = torch.tensor(question_overlap(units, question))
    h = hop(units, question, bm25_scores(units, question), ov)
    assert int(h.argmax()) == 2 and h[1] == 0  # the pointed-to fact first; the anchor itself 0
    assert h[2] > 2 * max(h[3], h[4], h[0])
    # a unit that holds every question word gets no hop, however many link words it shares
    full = units + ["Where the violin of Priya is kept, the old map of Tomas is kept too."]
    ov = torch.tensor(question_overlap(full, question))
    anchored = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.5])  # BM25 scores with unit 1 the best
    h = hop(full, question, anchored, ov)
    assert ov[5] == 1 and h[5] == 0 and int(h.argmax()) == 2


def test_select_respects_the_budget():
    scores = torch.tensor([0.1, 3.0, 2.0, -1.0, 1.0])
    lengths = [10, 30, 30, 10, 10]
    assert select(scores, lengths, 0.5) == [1, 4]  # 40 of 90: 30 + 10 (the 30 of unit 2 would overflow)
    assert select(scores, lengths, 0.01) == [1]  # the top one always
    assert select(scores, lengths, 0.5, limit=35) == [1]  # a token limit caps the budget
    # at the decision boundary: only scores >= 0 (the top one always)
    assert select(scores - 1.5, lengths, 0.9, fill=False) == [1, 2]
    assert select(scores - 5.0, lengths, 0.9, fill=False) == [1]
    # ties: the earlier unit first
    assert select(torch.zeros(4), [10, 10, 10, 10], 0.5) == [0, 1]


@needs_smol
def test_router_input_maps_tokens_to_their_sentences(smol):
    from masklab.context.routers.features import router_input

    tok = smol.tokenizer
    ex = make_examples("multikey", 512, 1, seed=3, tokenizer=tok)[0]
    ids, item = router_input(tok, ex.sentences, ex.question)
    assert tok.decode(ids[item == -2]).strip() == ex.question
    for i, s in enumerate(ex.sentences):
        assert tok.decode(ids[item == i]).split() == s.split(), i
