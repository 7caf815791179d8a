"""The arithmetic model-size sweep (`masklab sweep arith-size`): which runs it makes."""

from __future__ import annotations

import json

import pytest

from masklab.cli import SWEEPS, main
from masklab.util.errors import MasklabError
from masklab.lab.studies import arith_size


def test_specs_scale_width_and_depth_of_the_arith_model():
    cfg = arith_size.reproduce_config()
    specs = arith_size.specs_for(cfg)
    assert len(specs) == 3 * 3 * 3  # sizes x methods x seeds
    assert {s.task for s in specs} == {"add-0.4%"}
    assert {s.params["fraction"] for s in specs} == {0.004} and {s.params["op"] for s in specs} == {"add"}
    by_label = {(s.method, s.seed): s.params for s in specs}
    for k in (1, 2, 4):
        for method in ("vanilla", "mask", "mask-zero"):
            p = by_label[(f"{method}_x{k}", 0)]
            assert (p["method"], p["dim"], p["depth"], p["heads"]) == (method, 64 * k, 2 * k, 4)
            assert p["steps"] == 2500 and p["batch"] == 128 and p["lr"] == 1e-3  # the arith recipe at every size
    assert len({s.key for s in specs}) == len(specs)
    uneven = arith_size.specs_for(arith_size.Config(sizes=[[2, 1]], methods=["vanilla"], seeds=[0]))
    assert [(s.method, s.params["dim"], s.params["depth"]) for s in uneven] == [("vanilla_w2d1", 128, 2)]


@pytest.mark.parametrize("sizes, msg", [([], "at least one size"), ([[0, 1]], "both >= 1"), ([[1, 2, 3]], "both >= 1")])
def test_bad_sizes_are_one_clear_error(sizes, msg):
    with pytest.raises(MasklabError, match=msg):
        arith_size.validate(arith_size.Config(sizes=sizes))


def test_registered_as_a_sweep():
    import importlib

    from masklab.cli import build_parser

    assert importlib.import_module(SWEEPS["arith-size"]) is arith_size  # the name resolves to this module
    assert build_parser().parse_args(["sweep", "arith-size", "--quick"]).name == "arith-size"


@pytest.mark.slow
def test_quick_sweep_end_to_end(tmp_path, monkeypatch):
    cfg = arith_size.Config(
        sizes=[[1, 1], [2, 1]], methods=["vanilla", "mask-zero"], seeds=[0], steps=4, evals=1, test_size=100
    )
    monkeypatch.setattr(arith_size, "quick_config", lambda: cfg)
    assert main(["sweep", "arith-size", "--quick", "--jobs", "1", "--no-progress", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert [r["method"] for r in res["runs"]] == ["vanilla_x1", "mask-zero_x1", "vanilla_w2d1", "mask-zero_w2d1"]
    params = {r["method"]: r["extra"]["parameters"] for r in res["runs"]}
    assert params["vanilla_w2d1"] > 3 * params["vanilla_x1"]  # width x2: about 4x the weights
    assert params["mask-zero_x1"] > params["vanilla_x1"]  # the control's learnable prior
    assert "Parameters (vanilla)" in (tmp_path / "results.md").read_text()
