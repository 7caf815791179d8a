"""Teacher cache and the `masklab evidence --quick` CLI end to end."""

import json

import numpy as np
import pytest
import torch

from masklab.cli import main
from masklab.lab.evidence.teacher import TeacherConfig, load_or_train, schedule, gym_of


def test_teacher_cache_round_trip_and_curriculum(tmp_path):
    cfg = TeacherConfig(
        task="kv", items=6, vocab=32, dim=16, depth=1, heads=2, steps=5, batch=8, eval_examples=20, max_factor=2
    )
    a, info_a = load_or_train(cfg, tmp_path)
    b, info_b = load_or_train(cfg, tmp_path)
    assert not info_a["cached"] and info_b["cached"]
    assert info_a["acc_n"] == info_b["acc_n"]
    files = sorted(p.name for p in (tmp_path / "teachers").iterdir())
    assert files == [f"{cfg.key()}.json", f"{cfg.key()}.safetensors"]
    batch = gym_of(cfg).sample(4, 6, np.random.default_rng(0))
    args = (batch.items, batch.query, batch.valid, batch.positions)
    assert torch.equal(a(*args)[0], b(*args)[0])
    assert (
        cfg.key()
        != TeacherConfig(
            task="kv", items=6, vocab=32, dim=16, depth=1, heads=2, steps=6, batch=8, eval_examples=20, max_factor=2
        ).key()
    )
    # length curriculum: N first, up to max_factor * N at the end; hop curriculum for multihop
    mh = TeacherConfig(task="multihop", items=16, hops=3, steps=100)
    g = gym_of(mh)
    assert schedule(mh, 0, g)["n_items"][1] == 16 and schedule(mh, 99, g)["n_items"][1] == 64
    assert schedule(mh, 0, g)["max_hops"] == 1 and schedule(mh, 99, g)["max_hops"] == 3


def test_late_options_keep_old_cache_keys_and_recency_reader_runs():
    import hashlib
    from dataclasses import asdict

    from masklab.lab.evidence.teacher import CACHE_VERSION, build_teacher

    cfg = TeacherConfig(task="stale", hops=0)
    old = {k: v for k, v in asdict(cfg).items() if k not in ("recency", "device")}
    raw = json.dumps({"v": CACHE_VERSION, **old}, sort_keys=True)
    assert cfg.key() == f"stale-{hashlib.sha1(raw.encode()).hexdigest()[:12]}"
    assert TeacherConfig(task="stale", hops=0, device="cuda").key() != cfg.key()  # trained off the CPU: its own key
    rec = TeacherConfig(task="stale", hops=0, recency=True, items=6, vocab=32, dim=16, depth=1, heads=2)
    assert rec.key() != cfg.key()
    batch = gym_of(rec).sample(3, 6, np.random.default_rng(0))
    logits, _ = build_teacher(rec)(batch.items, batch.query, batch.valid, batch.positions)
    assert logits.shape == (3, 32)


def test_per_gym_teacher_recipe_and_explicit_flags_win():
    from masklab.lab.studies import evidence, routing

    def teachers(specs):
        return {s.task: evidence.teacher_config(s.params, s.params["gym"], s.params["hops"], s.seed) for s in specs}

    default = teachers(evidence.specs_for(evidence.Config()))
    assert (default["stale"].steps, default["stale"].recency) == (6000, True)
    assert (default["kv"].steps, default["kv"].recency) == (3000, False)
    h3 = teachers(evidence.specs_for(evidence.Config(tasks=["multihop"], hops=[2, 3])))
    assert h3["multihop-h2"].steps == 3000 and h3["multihop-h3"].steps == 6000 and h3["multihop-h3"].aux == 0
    assert "recency" not in evidence.specs_for(evidence.Config(tasks=["kv"]))[0].params  # old records resume
    flags = teachers(evidence.specs_for(evidence.Config(teacher_steps=500, recency_tasks=["kv"])))
    assert (flags["stale"].steps, flags["stale"].recency) == (500, False)
    assert (flags["kv"].steps, flags["kv"].recency) == (500, True)
    # the routing study reads the same recipe, so it finds the evidence study's cached teachers
    cfg = routing.Config(tasks=["stale", "kv", "multihop"], hops=[3])
    route = {
        (s.task, s.seed): routing.teacher_config(s.params, s.params["gym"], s.params["hops"], s.seed)
        for s in routing.prepare_specs(cfg)
    }
    assert route[("stale", 0)].key() == default["stale"].key() and route[("kv", 0)].key() == default["kv"].key()
    assert route[("multihop-h3", 0)].key() == h3["multihop-h3"].key()
    # one teacher per seed, trained from that seed (the evidence study's teacher of that seed) ...
    assert [route[("kv", s)].seed for s in cfg.seeds] == cfg.seeds == [0, 1, 2]
    assert len({route[("kv", s)].key() for s in cfg.seeds}) == 3
    # ... unless --no-teacher-per-seed: every seed reads the teacher of teacher_seed
    shared = routing.Config(tasks=["kv"], teacher_per_seed=False)
    assert {routing.teacher_config(s.params, "kv", 0, s.seed).key() for s in routing.prepare_specs(shared)} == {
        default["kv"].key()
    }


def test_aux_hop_targets_follow_the_chain(tmp_path):
    from masklab.lab.evidence.teacher import hop_targets, train_teacher

    cfg = TeacherConfig(
        task="multihop",
        items=8,
        vocab=64,
        hops=3,
        dim=16,
        depth=4,
        heads=2,
        steps=3,
        batch=4,
        eval_examples=8,
        max_factor=1,
        aux=1.0,
    )
    batch = gym_of(cfg).sample(6, 8, np.random.default_rng(1))
    t = hop_targets(batch, 4)
    assert torch.equal(t[:, 2], batch.answer) and torch.equal(t[:, 3], batch.answer)  # stays at the answer
    model, info = train_teacher(cfg)
    assert 0.0 <= info["acc_n"] <= 1.0 and len(info["curves"]["loss"]) > 0


@pytest.mark.slow
def test_quick_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "ev"
    argv = [
        "evidence",
        "--quick",
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "cache"),
        "--jobs",
        "1",
        "--no-progress",
        "--teacher-steps",
        "150",
        "--examples",
        "30",
    ]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["study"] == "evidence" and {r["task"] for r in res["runs"]} == {"multihop-h2", "stale"}
    rows = {(r["task"], r["method"]): r for r in res["summary"]}
    for task in ("multihop-h2", "stale"):
        for method in ("loo", "greedy-minimal", "group-testing", "last-mean/topk", "rollout/top10pct"):
            row = rows[(task, method)]
            assert 0 <= row["recall_mean"] <= 1 and 0 <= row["precision_mean"] <= 1
        assert rows[(task, "loo")]["passes_mean"] == 8
    assert "stale_over_current_layer0_mean" in rows[("stale", "teacher")]
    assert "miss_link1_mean" in rows[("multihop-h2", "teacher")]
    assert (out / "results.md").exists() and (out / "evidence_agreement.png").exists()
    # a second run reuses the cached teachers and the finished runs
    assert main(argv) == 0
    assert main(["evidence", "--quick", "--task", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown evidence task" in capsys.readouterr().err


def test_an_untrained_teacher_warns_and_marks_its_rows_and_a_trained_one_does_not(tmp_path, capsys, monkeypatch):
    argv = [
        "evidence",
        "--quick",
        "--task",
        "multihop",
        "--items",
        "6",
        "--teacher-steps",
        "30",
        "--examples",
        "60",
        "--method",
        "loo",
        "--aggregate",
        "last-mean",
        "--cache",
        str(tmp_path / "cache"),
        "--jobs",
        "1",
        "--no-progress",
    ]
    assert main([*argv, "--out", str(tmp_path / "untrained")]) == 0
    err = capsys.readouterr().err
    res = json.loads((tmp_path / "untrained" / "results.json").read_text())
    acc = res["runs"][0]["metrics"]["teacher_acc_n"]
    assert acc < 0.5 and res["runs"][0]["extra"]["teacher_untrained"] is True
    assert err.count("WARNING: Untrained teacher") == 1 and f"multihop-h2 (seed 0: {acc:.3f})" in err
    md = (tmp_path / "untrained" / "results.md").read_text().split("\n")
    assert md[0].startswith("> **Smoke test** (`--quick`)")  # then a blank line and the study's own results.md
    assert md[6].startswith("**Untrained teacher**") and "multihop-h2 (seed 0" in md[6]
    # the same threshold with an exact teacher (hand-written, accuracy 1): no warning, no mark
    from chain_teacher import ChainTeacher
    from masklab.lab.studies import evidence

    info = {"acc_n": 1.0, "acc_max": None, "cached": True, "curves": {"step": [], "loss": []}}
    monkeypatch.setattr(evidence, "load_or_train", lambda *a, **k: (ChainTeacher(64), info))
    assert main([*argv, "--out", str(tmp_path / "trained")]) == 0
    res = json.loads((tmp_path / "trained" / "results.json").read_text())
    assert "Untrained" not in capsys.readouterr().err and res["untrained_teachers"] == []
    assert res["runs"][0]["extra"]["teacher_untrained"] is False
    assert "Untrained" not in (tmp_path / "trained" / "results.md").read_text()
