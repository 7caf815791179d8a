"""`masklab realdocs`: ranks, answering units, the fusion of BM25 with a trained router, the
summary's paired tests, and the command end to end on the val split with word routers."""

import json

import torch

from conftest import needs_smol
from masklab.text.document import Document
from masklab.lab.realdocs import answering_units, choose, fusion_grid, rank_of, sign_flip_p, summarise
from masklab.context.router import Router
from masklab.context.routers.fused import Fused, fuse


def test_rank_counts_units_until_every_answering_unit_is_in():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.5])
    assert rank_of(scores, [[1]]) == 1
    assert rank_of(scores, [[1], [0]]) == 4  # both needed: the worse one decides
    assert rank_of(scores, [[3]]) == 3  # a tie goes to the earlier unit
    doc = Document(units=["aa bb", "cc dd", "ee"], spans=[(0, 5), (6, 11), (12, 14)], source="aa bb cc dd ee")
    assert answering_units(doc, [(3, 8), (12, 14)]) == [[0, 1], [2]]


def test_fusion_keeps_a_clear_bm25_winner_and_lets_the_trained_router_break_ties():
    bm25 = torch.tensor([8.0, 0.0, 0.0, 0.0, 0.0])
    trained = torch.tensor([0.0, 0.3, 0.2, 0.1, 0.0])  # prefers unit 1 mildly
    assert int(fuse(bm25, trained, "z", 0.5).argmax()) == 0
    tied = torch.tensor([3.0, 0.0, 3.0, 0.0, 0.0])  # two restatements of one fact
    later = torch.tensor([0.0, 0.0, 2.0, 0.0, 0.0])
    assert int(fuse(tied, later, "z", 0.5).argmax()) == 2
    assert int(fuse(tied, later, "rrf", 1.0).argmax()) == 2
    order = torch.argsort(
        fuse(torch.tensor([5.0, 4, 3, 2, 1]), torch.tensor([0.0, 0, 9, 0, 0]), "rerank", 3), descending=True
    ).tolist()
    assert order[:3] == [2, 0, 1] and order[3:] == [3, 4]  # re-ranked inside BM25's top 3 only


class Fixed(Router):
    name = "fixed"

    def __init__(self, lm=None, path=None):
        super().__init__(lm)
        self.meta = {}

    def score(self, doc, question):
        return torch.arange(len(doc.units), dtype=torch.float32)  # the last unit first


class FusedFixed(Fused):
    reads_model = False
    other_cls = Fixed


def test_a_fused_router_ranks_with_bm25_and_its_trained_part():
    doc = Document(
        units=[
            "The budget was approved by Ana.",
            "Filler about weather.",
            "Nothing here.",
            "The budget was approved by Ben later.",
        ]
    )
    s = FusedFixed(how="z", weight=0.5).score(doc, "Who approved the budget?")
    assert int(s.argmax()) == 3  # BM25 ties units 0 and 3; the trained part prefers the later one
    assert float(s[1]) < float(s[0])


def _row(i, kind, bm25_rr, ev_rr, bm25_kept, ev_kept):
    return {
        "id": str(i),
        "kind": kind,
        "bm25": {
            "router_seconds": 0.01,
            "rr": bm25_rr,
            "rank": round(1 / bm25_rr),
            "0.1": {"kept": bm25_kept, "kept_fraction": 0.1},
        },
        "evidence": {
            "router_seconds": 0.5,
            "rr": ev_rr,
            "rank": round(1 / ev_rr),
            "0.1": {"kept": ev_kept, "kept_fraction": 0.1},
        },
    }


def test_summary_tests_each_router_against_bm25_paired():
    rows = [_row(i, "two" if i % 2 else "single", 0.25, 1.0, False, True) for i in range(30)]
    s = {(r["task"], r["method"]): r for r in summarise(rows, ["bm25", "evidence"], [0.1])}
    ev = s[("all", "evidence")]
    assert ev["mrr"] == 1.0 and s[("all", "bm25")]["mrr"] == 0.25
    assert ev["p_mrr_vs_bm25"] < 0.001 and ev["p_kept@10_vs_bm25"] < 0.001
    assert ev["kept@10_lo"] > 0.85 and s[("two", "evidence")]["n"] == 15
    assert sign_flip_p([0.5] * 10, [0.5] * 10) == 1.0


def test_the_fusion_grid_and_the_rule_that_chooses():
    rows = []
    for i in range(6):  # BM25 ranks the answer second; the trained router first
        rows.append(
            {
                "lengths": [5, 5, 5, 5],
                "gold": [[2]],
                "bm25": {"scores": [0.0, 0.0, 1.0, 1.1]},
                "evidence": {"scores": [0.0, 0.0, 2.0, -1.0]},
            }
        )
    grid = fusion_grid({"m": rows}, keep=0.25)
    by = {(g["how"], g["weight"]): g for g in grid}
    assert by[("bm25", 0.0)]["mrr"] == 0.5 and by[("evidence", 0.0)]["mrr"] == 1.0
    best = choose(grid)
    assert best["how"] in ("z", "rrf", "rerank") and best["mrr"] == 1.0


@needs_smol
def test_the_command_measures_word_routers_on_the_val_split(shared_loads, tmp_path, capsys):
    from masklab.cli import main

    assert (
        main(
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "val",
                "--routers",
                "bm25,lexical",
                "--keep",
                "0.25",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "results_val.json").read_text())
    assert len(res["rows"]) >= 50 and res["benchmark"] and not (tmp_path / "reads.jsonl").exists()
    every = {(s["task"], s["method"]): s for s in res["summary"]}
    assert 0 < every[("all", "bm25")]["mrr"] <= 1 and "p_mrr_vs_bm25" in every[("all", "lexical")]
    assert "| all | bm25 |" in capsys.readouterr().out
    # the same settings again: a re-summary of the stored rows, the measuring run's seconds kept
    assert (
        main(
            [
                "realdocs",
                "--model",
                "smollm2-135m",
                "--split",
                "val",
                "--routers",
                "bm25,lexical",
                "--keep",
                "0.25",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "results_val.json").read_text())["seconds"] == res["seconds"]


def test_new_pruner_weights_name_new_runs(tmp_path, monkeypatch):
    from masklab.lab.realdocs import weights_digest
    from masklab.context.routers import pruner

    monkeypatch.setattr(pruner, "WEIGHTS", tmp_path)
    (tmp_path / "causal.safetensors").write_bytes(b"one")
    first = weights_digest("smollm2-135m", ["bm25", "pruner"])
    (tmp_path / "causal.safetensors").write_bytes(b"two")
    assert first.startswith("pruner-") and weights_digest("smollm2-135m", ["bm25", "pruner"]) != first
    assert weights_digest("smollm2-135m", ["bm25", "dense"]) == "none"
    both = weights_digest("smollm2-135m", ["evidence", "pruner-marks"]).split("+")
    assert both[0] == weights_digest("smollm2-135m", ["evidence"]) and both[1].startswith("pruner-")


def test_a_subset_takes_questions_in_turn_from_every_document():
    from masklab.lab.realdocs import in_turn
    from masklab.lab.tasks import realdocs

    qs = realdocs.load("val")
    first = in_turn(qs)[:7]
    assert len({q.doc for q in first}) == 7 == len({q.doc for q in qs})
    assert sorted(q.id for q in in_turn(qs)) == sorted(q.id for q in qs)


def test_every_router_is_also_tested_against_dense_when_it_was_measured_beside():
    rows = [_row(i, "single", 0.25, 1.0, False, True) for i in range(30)]
    for r in rows:
        r["dense"] = {**r["bm25"]}
    s = {(r["task"], r["method"]): r for r in summarise(rows, ["bm25", "evidence", "dense"], [0.1])}
    ev = s[("all", "evidence")]
    assert ev["p_mrr_vs_dense"] < 0.001 and ev["p_kept@10_vs_dense"] < 0.001
    assert "p_mrr_vs_dense" not in s[("all", "dense")]


def test_calibration_error_is_zero_for_honest_probabilities_and_platt_scaling_repairs_overconfidence():
    import numpy as np

    from masklab.lab.stats import platt, reliability

    rng = np.random.default_rng(0)
    p = rng.uniform(0.001, 0.999, 20000)
    y = rng.uniform(0, 1, 20000) < p  # evidence exactly as often as the probability says
    assert reliability(p, y)[0] < 0.02
    over = 1 / (1 + np.exp(-3 * np.log(p / (1 - p))))  # the same ranking, overconfident
    assert reliability(over, y)[0] > 0.08
    a, b = platt(over, y)
    fixed = 1 / (1 + np.exp(-(a * np.log(over / (1 - over)) + b)))
    assert abs(a - 1 / 3) < 0.05 and abs(b) < 0.05 and reliability(fixed, y)[0] < 0.02


def test_keep_rules_measure_the_product_selection_and_a_fixed_keep_of_the_same_tokens():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "keep_rules.py"
    spec = importlib.util.spec_from_file_location("keep_rules", path)
    kr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kr)
    rows = [{"gold": [[1], [3]], "lengths": [10, 10, 10, 10], "r": {"scores": [0.1, 0.9, 0.2, 0.6]}}]
    assert kr.outcomes(rows, "r", 0.5, "threshold", 0) == [(True, 0.5)]  # units 1 and 3: the evidence
    assert kr.outcomes(rows, "r", 0.7, "threshold", 0) == [(False, 0.25)]  # unit 1 alone misses unit 3
    assert kr.outcomes(rows, "r", 0.7, "threshold", 1) == [(False, 0.75)]  # and its neighbours 0 and 2
    assert kr.outcomes(rows, "r", 0.6, "relative", 0) == [(True, 0.5)]  # at least 0.6 x the best: 0.54
    assert kr.outcomes(rows, "r", None, "threshold", 0, fraction=0.25) == [(False, 0.25)]
    fig = kr.figures([(True, 0.5), (False, 0.25)])
    assert fig["kept"] == 0.5 and fig["fraction"] == 0.375 and fig["kept_lo"] < 0.5 < fig["kept_hi"]
