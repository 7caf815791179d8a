"""Runner: deterministic runs, mid-run checkpoint resume with identical numbers, results files."""

from dataclasses import asdict

import pytest
import torch

from masklab.lab.report import markdown_table
from masklab.lab.runner import Checkpoint, MasklabError, RunSpec, read_json, run_study, summarize
from masklab.lab.studies.gotu import Config, run_one, specs_for

TINY = dict(tasks=["2parity"], methods=["mask"], seeds=[0], steps=30, evals=3, width=16, depth=1, heads=2, batch=32)


def _spec(**kw):
    return asdict(specs_for(Config(**{**TINY, **kw}))[0])


def test_same_seed_same_numbers_other_seed_other_numbers(tmp_path):
    a = run_one(_spec(), tmp_path / "a")
    b = run_one(_spec(), tmp_path / "b")
    c = run_one(_spec(seeds=[1]), tmp_path / "c")
    assert a["metrics"] == b["metrics"] and a["curves"] == b["curves"]
    assert a["metrics"]["train_mse"] != c["metrics"]["train_mse"]


def test_killed_run_resumes_from_its_checkpoint_with_identical_results(tmp_path, monkeypatch):
    uninterrupted = run_one(_spec(), tmp_path / "full")
    saves = {"n": 0}
    original = Checkpoint.save

    def save_then_die(self, *args, **kwargs):
        original(self, *args, **kwargs)
        saves["n"] += 1
        if saves["n"] == 2:  # killed right after the step-20 checkpoint
            raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_one(_spec(), tmp_path / "killed")
    assert read_json(tmp_path / "killed" / "ckpt.json")["step"] == 20
    monkeypatch.setattr(Checkpoint, "save", original)
    resumed = run_one(_spec(), tmp_path / "killed")
    assert resumed["metrics"] == uninterrupted["metrics"]
    assert resumed["curves"] == uninterrupted["curves"]
    assert not Checkpoint(tmp_path / "killed").exists  # cleared after a finished run


def test_checkpoint_round_trip_restores_optimizer_and_generator(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    gen = torch.Generator().manual_seed(5)
    ck = Checkpoint(tmp_path)
    ck.save(7, model, opt, gen, {"curve": [1.0]})
    want_next = torch.rand(3, generator=gen)
    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
    gen2 = torch.Generator().manual_seed(0)
    step, extra = ck.load(model2, opt2, gen2)
    assert step == 7 and extra == {"curve": [1.0]}
    assert torch.equal(model2.weight, model.weight)
    assert opt2.param_groups[0]["lr"] == 0.1
    assert torch.equal(
        opt2.state[opt2.param_groups[0]["params"][0]]["exp_avg"], opt.state[opt.param_groups[0]["params"][0]]["exp_avg"]
    )
    assert torch.equal(torch.rand(3, generator=gen2), want_next)
    assert not list(tmp_path.glob("*.tmp"))


def test_study_skips_finished_runs_and_parallel_equals_serial(tmp_path):
    specs = specs_for(Config(**{**TINY, "seeds": [0, 1]}))
    serial = run_study("gotu", {}, specs, "masklab.lab.studies.gotu:run_one", tmp_path / "s", jobs=1, progress=False)
    parallel = run_study("gotu", {}, specs, "masklab.lab.studies.gotu:run_one", tmp_path / "p", jobs=2, progress=False)
    # seconds differ; git_rev too if the checkout changes while the test runs
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("seconds", "git_rev")} for r in rs]  # noqa: E731
    assert strip(serial["runs"]) == strip(parallel["runs"])
    results = read_json(tmp_path / "s" / "results.json")
    assert set(results) >= {"study", "config", "runs", "summary", "paper", "environment"}
    # a second call finds every run done and recomputes nothing
    before = (tmp_path / "s" / "runs").stat().st_mtime_ns
    again = run_study("gotu", {}, specs, "masklab.lab.studies.gotu:run_one", tmp_path / "s", jobs=1, progress=False)
    assert strip(again["runs"]) == strip(serial["runs"])
    assert [r["seconds"] for r in again["runs"]] == [r["seconds"] for r in serial["runs"]]
    assert (tmp_path / "s" / "runs").stat().st_mtime_ns == before


def test_failed_worker_keeps_finished_runs(tmp_path):
    good = specs_for(Config(**TINY))[0]
    bad = RunSpec("2parity", "mask", 1, {**good.params, "lr": float("inf")})
    with pytest.raises(MasklabError, match="a run failed"):
        run_study("gotu", {}, [good, bad], "masklab.lab.studies.gotu:run_one", tmp_path, jobs=2, progress=False)
    assert (tmp_path / "runs" / f"{good.key}.json").exists()


def test_summary_mean_std_n():
    runs = [
        {"task": "t", "method": "m", "metrics": {"acc": 1.0, "steps": None}},
        {"task": "t", "method": "m", "metrics": {"acc": 0.0, "steps": 10}},
    ]
    (row,) = summarize(runs)
    assert row["n"] == 2 and row["acc_mean"] == 0.5 and row["acc_std"] == pytest.approx(0.7071, abs=1e-4)
    assert row["steps_mean"] == 10 and row["steps_std"] is None  # one value: no spread measured


def test_model_has_its_own_place_and_leaves_other_studies_unchanged():
    plain = RunSpec("2parity", "mask", 0, {"lr": 1e-3})
    assert plain.key == "2parity__mask__s0"  # keys (and so resume) of studies without models are unchanged
    assert plain.as_dict() == {"task": "2parity", "method": "mask", "seed": 0, "params": {"lr": 1e-3}}
    lm = RunSpec("stale", "answer-attention", 0, {}, model="org/model-1")
    assert lm.key == "stale__org_model-1__answer-attention__s0" and lm.as_dict()["model"] == "org/model-1"
    runs = [
        {"task": "t", "model": "a", "method": "m", "metrics": {"acc": 1.0}},
        {"task": "t", "model": "b", "method": "m", "metrics": {"acc": 0.0}},
        {"task": "t", "method": "m", "metrics": {"acc": 0.5}},
    ]
    rows = summarize(runs)
    assert [(r["task"], r.get("model"), r["method"], r["acc_mean"]) for r in rows] == [
        ("t", "a", "m", 1.0),
        ("t", "b", "m", 0.0),
        ("t", None, "m", 0.5),
    ]
    assert "model" not in rows[2]


def test_results_of_a_study_without_models_have_no_model_key(tmp_path):
    res = run_study(
        "gotu", {}, specs_for(Config(**TINY))[:1], "masklab.lab.studies.gotu:run_one", tmp_path, progress=False
    )
    assert all("model" not in r and "model" not in r["spec"] for r in res["runs"])
    assert all("model" not in row for row in res["summary"])
    assert "| task | method | n |" in markdown_table(res["summary"], [], ["unseen_acc"])
    with_model = [dict(res["summary"][0], model="gemma3-270m")]
    assert markdown_table(with_model, [], ["unseen_acc"]).startswith("| task | model | method | n |")
