"""Interventions (hide by key bias / by deletion), evidence_sets and attention targets."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from masklab.lab.evidence import SEARCHES, attention_targets, evidence_mask, evidence_sets
from masklab.lab.evidence.attention_targets import AGGREGATES, SELECTIONS, rollout
from masklab.lab.evidence.interventions import answer_logits, oracle, pack_visible, variant_logits
from masklab.models.reader import EvidenceReader
from masklab.lab.runner import MasklabError
from masklab.lab.tasks.evidence_gyms import make_gym


class SolverModel(nn.Module):
    """A hand-built 'model' that answers exactly from the visible items (its evidence is gold)."""

    def __init__(self, gym, vocab):
        super().__init__()
        self.gym, self.vocab, self.calls = gym, vocab, 0

    def forward(self, items, query, visible, positions=None, return_attn=False):
        self.calls += items.shape[0]
        out = torch.zeros(items.shape[0], self.vocab)
        for b in range(items.shape[0]):
            its = [tuple(x) for x in items[b].tolist()]
            ans = self.gym.solve_one(its, visible[b].tolist(), tuple(query[b].tolist()), getattr(self.gym, "hops", 0))
            out[b, ans if ans >= 0 else 0] = 1.0
        return out, []


def reader(seed=0, vocab=64, max_items=32):
    torch.manual_seed(seed)
    return EvidenceReader(vocab, max_items, dim=32, depth=2, heads=2).eval()


@pytest.mark.parametrize("task", ["multihop", "stale", "kv", "aggregate"])
def test_every_search_finds_gold_on_a_model_whose_evidence_is_gold(task):
    gym = make_gym(task, vocab=128, hops=3)
    batch = gym.sample(12, (8, 20), np.random.default_rng(0))
    model = SolverModel(gym, 128)
    for method in SEARCHES:
        for mode in ("key_bias", "delete"):
            evs = evidence_sets(model, batch, method, mode)
            assert torch.equal(evidence_mask(evs, batch.items.shape[1]), batch.gold), (method, mode)
    n, k = batch.n_items, batch.gold.sum(1)
    gt = evidence_sets(model, batch, "group-testing")
    for ev, nb, kb in zip(gt, n.tolist(), k.tolist()):
        assert ev.forward_passes <= kb * math.ceil(math.log2(nb)) + kb + 1
    assert [e.forward_passes for e in evidence_sets(model, batch, "loo")] == n.tolist()


def test_hiding_nothing_gives_the_dense_output_exactly():
    gym = make_gym("stale", vocab=64)
    batch = gym.sample(6, (5, 12), np.random.default_rng(1))
    model = reader()
    dense = model(batch.items, batch.query, batch.valid, batch.positions)[0]
    assert torch.equal(answer_logits(model, batch), dense)
    assert torch.equal(answer_logits(model, batch, torch.ones_like(batch.valid)), dense)
    keeps = [torch.ones(1, int(n), dtype=torch.bool) for n in batch.n_items]
    for b, lg in enumerate(variant_logits(model, batch, keeps)):
        torch.testing.assert_close(lg[0], dense[b], rtol=0, atol=1e-5)


@pytest.mark.parametrize("task", ["multihop", "stale", "kv", "aggregate"])
def test_hiding_by_bias_and_by_deletion_agree(task):
    gym = make_gym(task, vocab=64, hops=2)
    batch = gym.sample(8, (6, 14), np.random.default_rng(2))
    model = reader(seed=3)
    keep = torch.rand(batch.valid.shape, generator=torch.Generator().manual_seed(0)) < 0.6
    a = answer_logits(model, batch, keep, "key_bias")
    b = answer_logits(model, batch, keep, "delete")
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    # deletion really shortens the sequence and keeps position ids
    items, pos, vis = pack_visible(batch.items, batch.positions, batch.valid & keep)
    assert items.shape[1] == int((batch.valid & keep).sum(1).max())
    assert torch.equal(pos[vis], batch.positions[batch.valid & keep])


def test_all_variants_of_an_example_run_in_one_forward_pass():
    gym = make_gym("kv", vocab=64)
    batch = gym.sample(5, 10, np.random.default_rng(4))
    model = SolverModel(gym, 64)
    holds = oracle(model, batch, 2)
    model.calls = 0
    keep = torch.ones(7, 10, dtype=torch.bool)
    keep[torch.arange(7), torch.arange(7)] = False
    ok = holds(keep)
    assert ok.shape == (7,) and model.calls == 7
    calls = []
    model.forward = (lambda f: lambda *a, **k: (calls.append(a[0].shape[0]), f(*a, **k))[1])(model.forward)
    evidence_sets(model, batch, "loo")
    assert calls[-1] == 5 * 10  # every leave-one-out variant of every example in one pass


def test_attention_targets_registry_and_selections():
    gym = make_gym("multihop", vocab=64, hops=2)
    batch = gym.sample(6, (6, 12), np.random.default_rng(5))
    model = reader()
    for agg in AGGREGATES:
        s = attention_targets(model, batch, agg)
        assert s.shape == batch.valid.shape and (s[~batch.valid] == 0).all() and (s >= 0).all()
    last = attention_targets(model, batch, "last-mean")
    assert torch.all(last.sum(1) <= 1 + 1e-5)
    top = attention_targets(model, batch, "last-mean", "topk")
    assert torch.equal(top.sum(1), batch.gold.sum(1))
    assert torch.equal(top, attention_targets(model, batch, "last-mean", "topk", k=batch.gold.sum(1)))
    ten = attention_targets(model, batch, "layer-mean", "top10pct")
    assert torch.equal(ten.sum(1), torch.tensor([max(1, math.ceil(0.1 * n)) for n in batch.n_items.tolist()]))
    assert attention_targets(model, batch, "layer1").shape == batch.valid.shape
    with pytest.raises(MasklabError):
        attention_targets(model, batch, "nope")
    # top-k: k > N keeps every valid item, k = 0 none; ties broken by index
    scores = torch.tensor([[0.5, 0.5, 0.1, 0.0]])
    valid = torch.tensor([[True, True, True, False]])
    assert SELECTIONS["topk"](scores, valid, 9).tolist() == [[True, True, True, False]]
    assert SELECTIONS["topk"](scores, valid, 0).sum() == 0
    assert SELECTIONS["topk"](scores, valid, 1).tolist() == [[True, False, False, False]]


def test_rollout_of_identity_attention_is_identity():
    eye = torch.eye(4).expand(1, 2, 4, 4)
    assert torch.allclose(rollout([eye, eye]), torch.zeros(1, 3))
    uniform = torch.full((1, 1, 3, 3), 1 / 3)
    r = rollout([uniform])
    assert torch.allclose(r, torch.tensor([[1 / 6, 1 / 6]]))


def test_router_targets_by_name():
    from masklab.lab.evidence.targets import target_masks, target_names

    gym = make_gym("multihop", vocab=64, hops=2)
    batch = gym.sample(5, (6, 12), np.random.default_rng(6))
    solver = SolverModel(gym, 64)
    assert torch.equal(target_masks(solver, batch, "gold"), batch.gold)
    assert torch.equal(target_masks(solver, batch, "loo"), batch.gold)
    model = reader()
    assert target_masks(model, batch, "rollout/topk").sum(1).tolist() == batch.gold.sum(1).tolist()
    assert target_masks(model, batch, "last-mean").dtype == torch.float32
    assert "greedy-minimal" in target_names() and "max-head/top10pct" in target_names()
    with pytest.raises(MasklabError, match="unknown target"):
        target_masks(model, batch, "bogus")
