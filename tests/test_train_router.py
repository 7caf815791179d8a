"""The trained routers: every shipped router file loads, says how it was made and fits its
model; `masklab train-router --quick` makes a router of the same shape; the held-out summary
has its intervals; the evaluation resumes from its rows."""

import json
from pathlib import Path

import pytest
import torch

from conftest import needs_smol
from masklab.context.routers.trained import WEIGHTS
from masklab.context.routers.features import FEATURE_SETS, load_routers
from masklab.pretrained.models import MODELS


def shipped():
    return sorted(WEIGHTS.glob("*.json"))


def test_every_packaged_model_ships_both_routers_with_their_metadata():
    assert {p.stem for p in shipped()} == set(MODELS)
    for path in shipped():
        routers, meta = load_routers(path.with_suffix(""))
        assert set(routers) == {"evidence", "attention"} and meta["model"] == path.stem
        assert meta["command"].startswith("masklab train-router") and meta["features"] in FEATURE_SETS
        assert meta["code"] and meta["label_cost"]["passes_per_labelled"] > 0 and meta["data"]["labelled"] >= 2
        ev, att = routers["evidence"], routers["attention"]
        assert ev.weight.shape == att.weight.shape == ev.mean.shape  # same features and model class
        assert not torch.equal(ev.weight, att.weight)  # but other labels


def test_summary_has_wilson_intervals_and_paired_tests():
    from masklab.lab.train_router import summarise

    def rec(kept, top):  # kept: every gold unit kept, or half of them
        return {"gold_kept": 1.0 if kept else 0.5, "gold_top": float(top), "kept": 0.2, "router_s": 0.01}

    def record(length, seed, **rows):
        return {"length": length, "kind": "update", "seed": seed, "rows": rows}

    rows = [
        record(
            1024,
            i,
            evidence=rec(True, True),
            attention=rec(i < 5, False),
            lexical=rec(i < 20, i < 3),
            bm25=rec(i < 20, False),
        )
        for i in range(30)
    ]
    rows += [record(2048, r["seed"], **{**r["rows"], "evidence": rec(r["seed"] < 15, False)}) for r in rows]
    summary = summarise(rows, answers=False)
    s = {r["method"]: r for r in summary if r["task"] == "update@1024"}
    assert s["evidence"]["all_gold_kept"] == 1.0 and s["evidence"]["all_gold_kept_lo"] > 0.85
    assert s["evidence"]["p_gold_vs_attention"] < 1e-5 and s["evidence"]["p_gold_vs_lexical"] < 0.01
    assert s["attention"]["all_gold_kept_hi"] < 0.4 and s["evidence"]["p_top_vs_lexical"] < 1e-5
    pooled = {r["method"]: r for r in summary if r["task"] == "all"}  # over both lengths: 45 / 60 kept, 30 / 60 top
    assert pooled["evidence"]["n"] == 60 and pooled["evidence"]["all_gold_kept"] == 0.75
    assert (
        pooled["evidence"]["gold_top"] == 0.5
        and pooled["evidence"]["gold_top_lo"] < 0.5 < pooled["evidence"]["gold_top_hi"]
    )
    assert not [r for r in summarise(rows, answers=True) if r["task"] == "all"]
    # other routers (scripts/heldout_routers.py): only the named ones, in their order; no paired
    # tests of evidence against routers that were not measured
    named = summarise(
        [record(1024, i, dense=rec(True, True), evidence=rec(False, False)) for i in range(30)],
        False,
        ("dense", "evidence"),
    )
    assert [r["method"] for r in named if r["task"] == "all"] == ["dense", "evidence"]
    assert named[0]["all_gold_kept"] == 1.0 and named[1]["all_gold_kept"] == 0.0 and "p_gold_vs_bm25" not in named[1]


@pytest.mark.slow
@needs_smol
def test_train_router_quick_makes_a_router_of_the_shipped_shape_and_resumes(shared_loads, tmp_path, capsys):
    from masklab.cli import main

    argv = ["train-router", "--quick", "--out", str(tmp_path), "--length", "256", "--no-progress"]
    assert main(argv) == 0
    routers, meta = load_routers(tmp_path / "smollm2-135m")
    ship, _ = load_routers(WEIGHTS / "smollm2-135m")
    assert routers["evidence"].weight.shape == ship["evidence"].weight.shape
    assert meta["data"]["examples"] == 8 and meta["command"].startswith("masklab train-router")
    labels = (tmp_path / "labels.jsonl").read_text().splitlines()
    assert len(labels) == 8 and all(json.loads(line)["passes"] >= 1 for line in labels)
    # a killed run resumes: drop the last label, run again, and only that example is labelled again
    (tmp_path / "labels.jsonl").write_text("\n".join(labels[:-1]) + "\n")
    assert main(argv) == 0
    again = (tmp_path / "labels.jsonl").read_text().splitlines()
    assert again[:-1] == labels[:-1] and json.loads(again[-1])["seed"] == json.loads(labels[-1])["seed"]
    # a label made from other text (a changed generator) is made again; the others are kept
    first = json.loads(again[0])
    (tmp_path / "labels.jsonl").write_text(
        "\n".join([json.dumps({**first, "example": "0ther0text00"})] + again[1:]) + "\n"
    )
    assert main(argv) == 0
    relabelled = (tmp_path / "labels.jsonl").read_text().splitlines()
    assert relabelled[:-1] == again[1:] and json.loads(relabelled[-1])["example"] == first["example"]
    # the held-out rows are named after the routers' weights: rows of other routers are never read
    ev = argv + [
        "--eval",
        "--eval-split",
        "val",
        "--eval-lengths",
        "256",
        "--eval-examples",
        "1",
        "--eval-kinds",
        "single",
    ]
    assert main(ev) == 0
    (rows_path,) = tmp_path.glob("eval_rows_val-*.jsonl")
    (row,) = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert rows_path.name == f"eval_rows_val-{row['router']}.jsonl" and row["length"] == 256
    assert set(row["rows"]) == {"evidence", "attention", "lexical", "bm25"}
    assert all(0 <= r["gold_kept"] <= 1 and r["gold_top"] in (0.0, 1.0) for r in row["rows"].values())
    rows_path.rename(tmp_path / "eval_rows_val-0ther0router.jsonl")
    assert main(ev) == 0
    assert [json.loads(line)["key"] for line in rows_path.read_text().splitlines()] == [row["key"]]
    # a row of the same routers made from other text is measured again, not reused
    rows_path.write_text(
        json.dumps({**row, "key": row["key"].replace(row["example"], "0ther0text00"), "example": "0ther0text00"}) + "\n"
    )
    assert main(ev) == 0
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert [r["example"] for r in rows] == ["0ther0text00", row["example"]]
    assert json.loads((tmp_path / "eval_val.json").read_text())["rows"] == [rows[1]]


@pytest.mark.parametrize("tasks", ["families", "longctx"])
def test_routers_on_generated_tasks_are_measured_once_and_resume(tasks, shared_loads, tmp_path, monkeypatch, capsys):
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("heldout_routers", root / "scripts" / "heldout_routers.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = [
        "heldout_routers.py",
        "--tasks",
        tasks,
        "--routers",
        "bm25,lexical",
        "--lengths",
        "256",
        "--examples",
        "1",
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    assert script.main() == 0
    res = json.loads((tmp_path / "results.json").read_text())
    kinds = {r["kind"] for r in res["rows"]}
    assert kinds == ({"single", "multikey", "update", "chain", "multi"} if tasks == "families" else set(script.LONGCTX))
    pooled = {s["method"]: s for s in res["summary"] if s["task"] == "all"}
    assert set(pooled) == {"bm25", "lexical"} and pooled["bm25"]["n"] == len(kinds)
    rows = next(tmp_path.glob("rows-*.jsonl"))
    before = rows.read_text()
    assert script.main() == 0 and rows.read_text() == before  # resumed: nothing measured again
    monkeypatch.setattr(sys, "argv", [*argv[:4], "bm25,lexical,dense", *argv[5:]])
    with pytest.raises(SystemExit, match="measured with other routers"):  # the stored rows lack dense
        script.main()
    capsys.readouterr()
