"""scripts/device_check.py: the parts that run on the CPU (argument parsing, the plan, the
attention step on the blocked path, the comparison of two gotu results, the pytest summary)
and, marked slow, the whole script with ``--device cpu --tiny``."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from masklab.util.errors import MasklabError

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("device_check", ROOT / "scripts" / "device_check.py")
dc = importlib.util.module_from_spec(spec)
sys.modules["device_check"] = dc
spec.loader.exec_module(dc)


def test_defaults_write_the_benchmark_file_only_for_a_full_gpu_run():
    assert dc.parse_args([]).out.endswith("benchmarks/device_check.json")
    assert dc.parse_args(["--device", "cpu"]).out.endswith("runs/device_check.json")
    assert dc.parse_args(["--tiny"]).out.endswith("runs/device_check.json")
    assert dc.parse_args(["--tiny"]).reps == 3 and dc.parse_args([]).reps == 7


def test_bad_arguments_are_usage_errors(capsys):
    for argv in (["--skip", "gotu"], ["--reps", "0"]):
        with pytest.raises(SystemExit) as e:
            dc.parse_args(argv)
        assert e.value.code == 2
    assert "unknown step(s) gotu" in capsys.readouterr().err


def test_dry_run_prints_the_plan_of_every_step(capsys):
    assert dc.main(["--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in plan["steps"]] == list(dc.STEPS)
    assert plan["steps"][1]["lengths"] == [64, 256, 1024, 4096]
    assert "reproduce gotu --quick --device cuda" in plan["steps"][2]["commands"][0]
    assert "--device cpu" in plan["steps"][2]["commands"][1]
    longctx = plan["steps"][3]["commands"]
    assert "--model smollm2-135m --length 8192" in longctx[0] and "--model gemma3-270m --length 32768" in longctx[1]
    assert sum(dc.LIMITS.values()) <= 8 * 60


def test_tiny_plan_has_no_long_context_runs(capsys):
    dc.main(["--dry-run", "--tiny", "--device", "cpu", "--skip", "gpu_tests"])
    assert [s["step"] for s in json.loads(capsys.readouterr().out)["steps"]] == ["attention", "gotu_quick"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_one_clear_error(tmp_path):
    with pytest.raises(MasklabError, match="no CUDA GPU"):
        dc.main(["--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_pytest_summary_counts():
    assert dc.pytest_counts("3 failed, 20 passed, 35 skipped, 1 error in 6.56s") == {
        "passed": 20,
        "failed": 3,
        "skipped": 35,
        "deselected": 0,
        "errors": 1,
    }
    assert dc.pytest_counts("35 skipped, 40 deselected in 5.91s")["deselected"] == 40


def test_compare_runs_takes_the_largest_difference_per_metric_against_its_tolerance():
    def run(seed, acc, mse):
        return {
            "task": "2parity",
            "method": "mask",
            "seed": seed,
            "metrics": {"unseen_acc": acc, "train_mse": mse, "steps_to_99": None},
        }

    dev = {"runs": [run(0, 0.95, 0.001), run(1, 1.0, 0.002)]}
    cpu = {"runs": [run(0, 0.96, 0.001), run(1, 1.0, 0.030)]}
    out = dc.compare_runs(dev, cpu)
    assert out["max_abs_diff"] == {"unseen_acc": pytest.approx(0.01), "train_mse": pytest.approx(0.028)}
    assert out["within"] is False and out["runs_compared"] == 2  # train_mse differs by more than 0.01
    assert dc.compare_runs(dev, dev)["within"] is True


def test_attention_step_on_the_cpu_compares_the_prior_path_with_math():
    args = dc.parse_args(["--device", "cpu", "--tiny", "--reps", "1"])
    out = dc.attention(args, torch.device("cpu"))
    assert [r["T"] for r in out["rows"]] == [16, 32]
    for r in out["rows"]:
        assert "error" not in r, r
        assert r["prior_vs_math_max_abs_y"] < 1e-5 and r["prior_vs_math_max_rel_grad"] < 1e-4
        assert set(r["ratio_to_plain"]) == {"prior", "math", "frozen"}
    assert out["goal_prior_le_1.2x_plain_at_T_ge_256"] is None  # no length >= 256 measured


@pytest.mark.slow
def test_the_whole_script_runs_tiny_on_the_cpu(tmp_path):
    out = tmp_path / "check.json"
    assert dc.main(["--device", "cpu", "--tiny", "--reps", "1", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["device"] == "cpu" and set(rep["steps"]) == {"gpu_tests", "attention", "gotu_quick"}
    assert (
        rep["steps"]["gpu_tests"]["rc"] == 0 and rep["steps"]["gpu_tests"]["passed"] == 0
    )  # every gpu test skips here
    g = rep["steps"]["gotu_quick"]
    assert g["device_rc"] == g["cpu_rc"] == 0 and g["within"] is True
    assert set(g["max_abs_diff"].values()) == {0.0}  # CPU against CPU: the same numbers


def test_the_masklab_commands_it_runs_parse_with_masklab_own_parser():
    from masklab.cli import build_parser

    ap = build_parser()
    for tiny in (False, True):
        args = dc.parse_args(["--tiny"] if tiny else [])
        cmds = [dc.gotu_command(args, "cuda", "OUT"), dc.gotu_command(args, "cpu", "OUT")]
        cmds += [dc.longctx_command(args, m, n, "OUT") for m, n in dc.LONGCTX]
        for cmd in cmds:
            assert cmd[1:3] == ["-m", "masklab"]
            ns = ap.parse_args(cmd[3:])  # a renamed flag fails here, not on the GPU machine
            assert ns.device in ("cuda", "cpu") and ns.out == "OUT"
