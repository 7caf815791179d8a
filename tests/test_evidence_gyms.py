"""Evidence gyms: the gold evidence is exactly what the answer is derived from."""

import numpy as np
import pytest
import torch

from masklab.lab.runner import MasklabError
from masklab.lab.tasks.evidence_gyms import GYMS, make_gym


def gyms():
    return [make_gym("multihop", hops=h) for h in (1, 2, 3, 4)] + [
        make_gym("stale", updates=2),
        make_gym("stale", updates=3),
        make_gym("kv"),
        make_gym("aggregate"),
    ]


@pytest.mark.parametrize("gym", gyms(), ids=lambda g: f"{g.name}-{g.params}")
def test_gold_is_sufficient_and_every_gold_item_is_necessary(gym):
    batch = gym.sample(40, (gym.min_items, 24), np.random.default_rng(0))
    assert torch.equal(gym.solve(batch), batch.answer)  # full context
    assert torch.equal(gym.solve(batch, batch.gold), batch.answer)  # gold alone
    for b in range(len(batch)):
        for j in batch.gold[b].nonzero().flatten().tolist():
            keep = batch.valid.clone()
            keep[b, j] = False
            assert gym.solve(batch.select([b]), keep[[b]])[0] != batch.answer[b]
        # and hiding any non-gold item never changes the answer
        for j in (~batch.gold[b] & batch.valid[b]).nonzero().flatten().tolist()[:5]:
            keep = batch.valid.clone()
            keep[b, j] = False
            assert gym.solve(batch.select([b]), keep[[b]])[0] == batch.answer[b]


def test_variable_n_batches_are_padded():
    gym = make_gym("stale")
    batch = gym.sample(64, (4, 20), np.random.default_rng(1))
    n = batch.n_items
    assert int(n.min()) >= 4 and int(n.max()) == batch.items.shape[1] <= 20 and len(set(n.tolist())) > 3
    assert (batch.items[~batch.valid] == 0).all() and not (batch.gold & ~batch.valid).any()
    assert (batch.items[batch.valid] > 0).all()


def test_multihop_shapes_and_gold_size():
    gym = make_gym("multihop", hops=3)
    batch = gym.sample(30, 16, np.random.default_rng(2))
    assert (batch.gold.sum(1) == 3).all() and (batch.hops == 3).all()
    # distractor paths share the shape: every source symbol has one successor; the answer is
    # often not a sink and the query often has a predecessor (chain end / root heuristics fail)
    not_sink = sum(int((batch.items[b, :, 0] == batch.answer[b]).any()) for b in range(30))
    has_pred = sum(int((batch.items[b, :, 1] == batch.query[b, 0]).any()) for b in range(30))
    assert 5 < not_sink < 25 and 5 < has_pred < 25


def test_stale_gold_is_the_latest_assignment():
    gym = make_gym("stale", updates=3)
    batch = gym.sample(30, 12, np.random.default_rng(3))
    for b in range(30):
        same = (batch.items[b, :, 0] == batch.query[b, 0]).nonzero().flatten()
        assert len(same) == 3 and batch.gold[b, same[-1]] and batch.gold[b].sum() == 1


def test_same_seed_same_examples_and_bad_input_is_reported():
    a = make_gym("kv").sample(8, 10, np.random.default_rng(5))
    b = make_gym("kv").sample(8, 10, np.random.default_rng(5))
    assert torch.equal(a.items, b.items) and torch.equal(a.answer, b.answer)
    with pytest.raises(MasklabError, match="vocab"):
        make_gym("multihop", vocab=20).sample(2, 16, np.random.default_rng(0))
    with pytest.raises(MasklabError, match="hops"):
        make_gym("multihop", hops=5)
    with pytest.raises(MasklabError, match="updates"):
        make_gym("stale", updates=1)
    with pytest.raises(MasklabError, match="unknown evidence task"):
        make_gym("nope")
    assert set(GYMS) == {"multihop", "stale", "kv", "aggregate"}
