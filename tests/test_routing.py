"""Routers, budgets, sparse inference (= masking), router training, and `masklab routing --quick`."""

import json

import numpy as np
import pytest
import torch

from masklab.cli import build_parser, main
from masklab.lab.evidence.interventions import answer_logits
from masklab.lab.evidence.teacher import TeacherConfig, build_teacher
from masklab.lab.routing import (
    TOKEN_ROUTERS,
    build_router,
    keep_mask,
    parse_budget,
    router_loss,
    sparse_answer,
    train_router,
    transformer_flops,
)
from masklab.lab.routing.sparse import SELECTORS, budget_k, teacher_answer
from masklab.lab.routing.train import fit_recall
from masklab.lab.runner import MasklabError
from masklab.lab.tasks.evidence_gyms import make_gym

from chain_teacher import ChainTeacher


def batch_of(task="multihop", n=(5, 9), size=6, seed=0, vocab=64):
    return make_gym(task, vocab, 2).sample(size, n, np.random.default_rng(seed))


@pytest.mark.parametrize("name", sorted(TOKEN_ROUTERS))
def test_routers_score_every_item_and_mask_padding(name):
    b = batch_of()
    router = build_router(name, 64, dim=16, depth=2, heads=2)
    s = router(b.items, b.query, b.valid, b.positions)
    assert s.shape == b.valid.shape
    assert torch.isinf(s[~b.valid]).all() and torch.isfinite(s[b.valid]).all()
    assert router.flops(16) > router.flops(8) > 0


def test_only_the_transformer_router_lets_items_see_each_other():
    b = batch_of(n=8, size=2)
    changed = b.items.clone()
    changed[:, 5] = torch.tensor([7, 9])  # change item 5 only
    for name, interacts in (("transformer", True), ("independent", False)):
        torch.manual_seed(0)
        r = build_router(name, 64, dim=16, depth=2, heads=2)
        a = r(b.items, b.query, b.valid, b.positions)[:, :5]
        c = r(changed, b.query, b.valid, b.positions)[:, :5]
        assert (not torch.allclose(a, c)) == interacts, name


def test_transformer_flops_by_hand():
    # one block, T = 2, D = 4, mlp ratio 4: 2*2*(4+8)*16 + 4*4*4 = 768 + 64
    assert transformer_flops(2, 4, 1) == 832
    assert transformer_flops(2, 4, 3) == 3 * 832


def test_budget_parsing_and_errors():
    assert parse_budget("3") == 3 and parse_budget("10%") == pytest.approx(0.1) and parse_budget("0.25") == 0.25
    assert parse_budget("gold") == "gold" and parse_budget(0) == 0
    for bad in ("abc", "-1", "150%", "0.0", "1.5"):
        with pytest.raises(MasklabError):
            parse_budget(bad)


def test_budget_handling_k_above_n_zero_fraction_and_ties():
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    scores = torch.tensor([[1.0, 1.0, 1.0, 9.0], [0.5, 2.0, 2.0, 0.1]])
    assert keep_mask(scores, valid, 10).tolist() == valid.tolist()  # k > n keeps every real item, never padding
    assert not keep_mask(scores, valid, 0).any()
    assert keep_mask(scores, valid, 1).tolist() == [
        [True, False, False, False],
        [False, True, False, False],
    ]  # ties: earlier item
    assert budget_k(0.5, valid).tolist() == [2, 2]  # ceil(0.5 * n)
    gold = torch.tensor([[False, True, False, False], [True, True, True, False]])
    assert budget_k("gold", valid, gold).tolist() == [1, 3]
    assert keep_mask(scores, valid, threshold=0.8).tolist() == [
        [False, False, False, False],
        [False, True, True, False],
    ]
    with pytest.raises(MasklabError):
        keep_mask(scores, valid)


def test_k_zero_means_the_teacher_answers_from_the_query_alone():
    torch.manual_seed(0)
    b = batch_of(size=4)
    teacher = build_teacher(TeacherConfig(vocab=64, items=9, max_factor=1, dim=16, depth=2, heads=2)).eval()
    keep = torch.zeros_like(b.valid)
    no_items = teacher(b.items[:, :0], b.query, b.valid[:, :0], b.positions[:, :0])[0].argmax(-1)
    assert torch.equal(teacher_answer(teacher, b, keep, "delete"), no_items)
    assert torch.equal(teacher_answer(teacher, b, keep, "key_bias"), no_items)


def test_routing_by_dropping_items_equals_masking_them():
    torch.manual_seed(0)
    b = batch_of(size=16, n=(4, 12))
    teacher = build_teacher(TeacherConfig(vocab=64, items=12, max_factor=1, dim=32, depth=3, heads=4)).eval()
    router = build_router("transformer", 64, dim=16, depth=2, heads=2)
    answers, keep = sparse_answer(teacher, router, b, budget=3)
    assert (keep.sum(1) == torch.minimum(b.valid.sum(1), torch.tensor(3))).all()
    masked = answer_logits(teacher, b, keep, "key_bias")
    dropped = answer_logits(teacher, b, keep, "delete")
    assert torch.allclose(masked, dropped, atol=1e-5)
    assert torch.equal(answers, masked.argmax(-1))
    _, by_threshold = sparse_answer(teacher, router, b, budget=None, threshold=0.5)
    scores = router(b.items, b.query, b.valid, b.positions)
    assert torch.equal(by_threshold, (torch.sigmoid(scores) >= 0.5) & b.valid)


def test_router_loss_ignores_padding_and_listwise_takes_soft_targets():
    valid = torch.tensor([[True, True, False]])
    target = torch.tensor([[True, False, False]])
    a = router_loss(torch.tensor([[2.0, -1.0, float("-inf")]]), target, valid)
    assert torch.isfinite(a)
    soft = torch.tensor([[0.9, 0.1, 0.0]])
    good = router_loss(torch.tensor([[3.0, 0.0, float("-inf")]]), soft, valid)
    bad = router_loss(torch.tensor([[0.0, 3.0, float("-inf")]]), soft, valid)
    assert torch.isfinite(good) and good < bad
    assert fit_recall(torch.tensor([[3.0, 0.0, float("-inf")]]), target, valid) == 1.0


def test_a_router_learns_gold_evidence_on_a_tiny_gym_and_fixed_pools_work():
    torch.manual_seed(0)
    gym = make_gym("kv", 32)
    router = build_router("transformer", 32, dim=32, depth=2, heads=2)
    info = train_router(router, gym, "gold", items=6, steps=250, batch=32, lr=3e-3)
    b = gym.sample(200, 6, np.random.default_rng(5))
    with torch.no_grad():
        s = router(b.items, b.query, b.valid, b.positions)
    assert fit_recall(s, b.gold, b.valid) > 0.9, info["curves"]["recall"]
    pool = gym.sample(64, 6, np.random.default_rng(1))
    info = train_router(build_router("independent", 32, dim=8, depth=1), pool, pool.gold, items=6, steps=3, batch=16)
    assert len(info["curves"]["loss"]) == 3
    with pytest.raises(MasklabError, match="teacher"):
        train_router(router, gym, "loo", items=6, steps=1)
    with pytest.raises(MasklabError, match="do not match"):
        train_router(router, pool, pool.gold[:, :3], items=6, steps=1)


def test_baseline_selectors():
    b = batch_of(size=3, n=7)
    rng = np.random.default_rng(0)
    recent = keep_mask(SELECTORS["recent"].score(None, b, rng), b.valid, 2)
    assert recent[:, -2:].all() and not recent[:, :-2].any()
    assert torch.equal(keep_mask(SELECTORS["oracle-gold"].score(None, b, rng), b.valid, "gold", gold=b.gold), b.gold)
    r = SELECTORS["random"].score(None, b, rng)
    assert r.shape == b.valid.shape


def test_every_baseline_is_a_selector():
    from masklab.lab.studies.routing import BASELINES

    assert set(BASELINES) == set(SELECTORS)


def test_reproduce_routing_is_the_routing_study_and_the_target_sweep_uses_it():
    from masklab.cli import STUDIES, SWEEPS
    from masklab.lab.studies import routing_targets

    assert build_parser().parse_args(["reproduce", "routing", "--quick"]).name == "routing"
    import importlib

    from masklab.lab.studies import routing

    assert importlib.import_module(STUDIES["routing"]) is routing
    assert importlib.import_module(SWEEPS["routing-targets"]) is routing_targets
    cfg = routing_targets.quick_config()
    routing_targets.routing.validate(cfg)  # every target name of the sweep is known
    assert {"causal", "rollout/topk", "last-mean"} <= set(cfg.targets)


def test_routing_cli_quick_end_to_end(tmp_path, capsys):
    out, cache = tmp_path / "r", tmp_path / "cache"
    argv = [
        "routing",
        "--quick",
        "--task",
        "kv",
        "--items",
        "6",
        "--teacher-steps",
        "150",
        "--router-steps",
        "60",
        "--pool",
        "200",
        "--examples",
        "40",
        "--budgets",
        "1,2",
        "--lengths",
        "1,2",
        "--out",
        str(out),
        "--cache",
        str(cache),
        "--jobs",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    # a 150-step teacher is untrained (below --min-teacher-acc): one warning, marked runs and table
    err = capsys.readouterr().err
    assert err.count("WARNING: Untrained teacher") == 1 and "kv (seed 0" in err
    assert res["untrained_teachers"][0]["task"] == "kv" and all(r["extra"]["teacher_untrained"] for r in res["runs"])
    md = (out / "results.md").read_text().split("\n")
    assert md[0].startswith("> **Smoke test** (`--quick`)")  # then a blank line and the study's own results.md
    assert md[6].startswith("**Untrained teacher**: held-out accuracy at N below 0.5")
    methods = {r["method"] for r in res["summary"]}
    assert {
        "router/gold",
        "router/causal",
        "router/attention",
        "dense",
        "random",
        "oracle-gold",
        "teacher-attention",
    } <= methods
    gold = next(r for r in res["summary"] if r["method"] == "oracle-gold")
    assert gold["recall_1x_mean"] == 1.0 and gold["kept_1x_mean"] == 1.0
    dense = next(r for r in res["summary"] if r["method"] == "dense")
    assert 0.0 <= dense["acc_2x_mean"] <= 1.0 and "acc_2x@1_mean" in dense
    # the headline fractions of the context (no gold size) are measured and tabled beside the gold budget
    assert gold["acc_1x@10pct_mean"] is not None and gold["recall_2x@25pct_mean"] == 1.0
    assert (
        "## Teacher accuracy from the kept items (budget 25% of each context; N = 6)"
        in (out / "results.md").read_text()
    )
    assert (out / "routing_budget.png").stat().st_size > 0 and "router/causal" in (out / "results.md").read_text()
    assert any((cache / "pools").iterdir())
    # a second run resumes everything (nothing retrained)
    assert main(argv) == 0
    assert "sum of run times" in (out / "results.md").read_text()
    # bad input: one clear message, exit 2
    assert main(["route", "--quick", "--budget", "lots", "--out", str(tmp_path / "bad")]) == 2
    assert "budget" in capsys.readouterr().err


def test_the_causal_router_keeps_the_second_link_that_the_attention_router_misses(tmp_path, monkeypatch):
    """End to end through the routing study with a teacher whose attention misses the second link:
    the router trained on causal evidence keeps both links, the one trained on attention (k = gold
    size) only the first. Swapping the two targets, or computing both the same way, fails this."""
    from masklab.lab.studies import routing

    teacher = ChainTeacher(64)
    info = {"acc_n": 1.0, "acc_max": None, "cached": True, "curves": {}}
    monkeypatch.setattr(routing, "load_or_train", lambda *a, **k: (teacher, info))
    cfg = routing.Config(
        tasks=["multihop"],
        hops=[2],
        items=6,
        vocab=64,
        max_factor=1,
        lengths=[1],
        seeds=[0],
        targets=["causal", "attention-gold-k"],
        independent_targets=[],
        baselines=["dense"],
        budgets=["2"],
        fractions=[],
        router_dim=32,
        router_depth=2,
        router_heads=4,
        router_lr=5e-3,
        router_steps=400,
        pool=2000,
        examples=200,
        cache=str(tmp_path / "c"),
    )
    res = routing.run(cfg, tmp_path / "r", progress=False)
    rows = {r["method"]: r for r in res["summary"]}
    assert rows["dense"]["acc_1x_mean"] == 1.0  # the teacher is exact
    causal, attention = rows["router/causal"], rows["router/attention-gold-k"]
    # measured (seed 0): causal recall 0.93, accuracy 0.86; attention 0.60 (the first link and a tie), 0.20
    assert causal["recall_1x_mean"] > 0.85 and causal["acc_1x_mean"] > 0.7, causal
    assert attention["recall_1x_mean"] < 0.7 and attention["acc_1x_mean"] < 0.35, attention
    assert not res["untrained_teachers"] and "Untrained" not in (tmp_path / "r" / "results.md").read_text()


def test_the_attention_target_takes_k_from_a_fixed_fraction_and_attention_gold_k_from_gold():
    import math

    from masklab.lab.studies import routing

    cfg = routing.Config(
        tasks=["multihop"],
        hops=[2],
        items=8,
        vocab=64,
        max_factor=1,
        pool=64,
        targets=["causal", "attention", "attention-gold-k"],
        independent_targets=[],
    )
    p = routing.gym_params(cfg, "multihop", 2)
    assert [routing.target_key(t, p) for t in cfg.targets] == ["loo", "last-mean/topk@25pct", "last-mean/topk"]
    pool, targets = routing.build_pool(ChainTeacher(64), p, "multihop", 2, 0)
    n = pool.valid.sum(1)
    assert torch.equal(targets["last-mean/topk"].sum(1), pool.gold.sum(1))
    assert targets["last-mean/topk@25pct"].sum(1).tolist() == [math.ceil(0.25 * int(m)) for m in n]
    assert torch.equal(targets["loo"], pool.gold)  # the exact teacher needs exactly the chain
