"""The device choice (``--device``, ``device=``), precision and what results record about them.

These run on the CPU: the device logic, dtype handling and ``--device cuda`` on a machine
without CUDA (one clear error). CUDA numbers are compared with CPU numbers by the ``gpu``
tests and ``scripts/device_check.py``.
"""

from dataclasses import asdict

import pytest
import torch

from conftest import needs_gpu, needs_smol
from masklab.util import device as devices
from masklab import cli
from masklab.lab import executors
from masklab.priors.attention import Attention
from masklab.priors.bias import MaskPrior
from masklab.util.errors import MasklabError
from masklab.lab.runner import read_json, run_study
from masklab.lab.runs import execute
from masklab.lab.studies.gotu import Config, run_one, specs_for

TINY = dict(tasks=["2parity"], methods=["mask"], seeds=[0], steps=6, evals=2, width=16, depth=1, heads=2, batch=16)
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a machine without CUDA")


@no_cuda
def test_auto_is_the_cpu_without_cuda_and_cuda_with_it(monkeypatch):
    assert devices.resolve("auto") == torch.device("cpu")
    assert devices.resolve(None) == torch.device("cpu")
    assert devices.resolve("CPU") == torch.device("cpu")
    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    assert devices.resolve("auto") == torch.device("cuda")


@no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_one_clear_error(name):
    with pytest.raises(MasklabError, match=f"--device {name}: this machine has no CUDA GPU.*use --device cpu or auto"):
        devices.resolve(name)


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "gpu"])
def test_unknown_device_names_are_rejected(name):
    with pytest.raises(MasklabError, match="unknown device"):
        devices.resolve(name)


def test_unknown_precision_is_rejected():
    with pytest.raises(MasklabError, match="unknown precision 'fp8'"):
        devices.use("cpu", "fp8")


@no_cuda
@pytest.mark.parametrize("command", ["gotu", "train-router"])
def test_cli_device_cuda_without_a_gpu_exits_2_with_one_line(command, tmp_path, capsys):
    code = cli.main([command, "--quick", "--device", "cuda", "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("masklab: error: --device cuda: this machine has no CUDA GPU")
    assert not (tmp_path / "o").exists()  # refused before anything was written
    assert devices.current() == torch.device("cpu")


def test_train_router_loads_its_model_on_the_chosen_device(tmp_path, monkeypatch):
    from masklab.pretrained import models

    asked = {}

    def load(name, **kw):  # stands in for the model: records where it was asked to go, then stops the command
        asked.update(kw)
        raise MasklabError("stop after the load")

    monkeypatch.setattr(models, "load", load)
    monkeypatch.setattr(models, "check_models", lambda names: None)
    assert cli.main(["train-router", "--quick", "--device", "cpu", "--out", str(tmp_path), "--no-progress"]) == 2
    assert asked["device"] == torch.device("cpu")


def test_every_study_and_real_lm_command_takes_device_and_precision():
    ap = cli.build_parser()
    sub = next(a for a in ap._actions if a.dest == "command")
    for name, p in sub.choices.items():
        if name == "report":
            continue
        opts = {o for a in p._actions for o in a.option_strings}
        assert {"--device", "--precision"} <= opts, name


def test_every_study_runs_on_cuda():
    """Each study's run function (the module run_study reads DEVICES from) declares CUDA; the
    pretrained study runs its three parts' run functions."""
    import importlib

    from masklab.lab.studies import cite_compare, prune, stale

    modules = [importlib.import_module(m) for name, m in cli.STUDIES.items() if name != "pretrained"]
    for mod in [*modules, stale, cite_compare, prune]:
        assert getattr(mod, "DEVICES", ()) == ("cpu", "cuda"), mod.__name__


def test_a_run_names_its_teachers_device(monkeypatch):
    """The teacher of a run on CUDA is trained and cached apart (its key: test_evidence_study)."""
    from masklab.lab.studies import evidence

    p = {**asdict(evidence.quick_config()), "teacher_steps": 5, "aux": 0.0}
    assert evidence.teacher_config(p, "kv", 0, 0).device == "cpu"
    monkeypatch.setattr(devices, "cuda_available", lambda: True)  # pretend: only the device's type is read
    with devices.using("cuda"):
        assert evidence.teacher_config(p, "kv", 0, 0).device == "cuda"  # a run on CUDA trains (and caches) its own


def test_using_restores_the_previous_choice():
    assert devices.current() == torch.device("cpu") and devices.precision() == "fp32"
    with devices.using("cpu", "bf16") as dev:
        assert dev == torch.device("cpu") and devices.precision() == "bf16"
    assert devices.precision() == "fp32"


def test_describe_names_the_device():
    d = devices.describe(torch.device("cpu"), "fp32")
    assert d["device"] == "cpu" and d["precision"] == "fp32" and isinstance(d["device_name"], str) and d["device_name"]


def test_to_moves_nested_tensors_and_leaves_the_rest():
    x = torch.ones(2)
    out = devices.to({"a": (x, [x]), "b": 3}, torch.device("cpu"))
    assert out["a"][0] is x and out["a"][1][0] is x and out["b"] == 3


def test_of_is_where_a_modules_parameters_live():
    assert devices.of(torch.nn.Linear(2, 2, device="meta")) == torch.device("meta")  # read from the parameters
    assert devices.of(torch.nn.ReLU()) == torch.device("cpu")  # none: the CPU


def test_autocast_is_a_null_context_in_fp32_and_bf16_on_cpu_casts_matmuls():
    a = torch.randn(4, 4)
    with devices.autocast(torch.device("cpu"), "fp32"):
        assert (a @ a).dtype == torch.float32
    with devices.autocast(torch.device("cpu"), "bf16"):
        assert (a @ a).dtype == torch.bfloat16
    assert devices.grad_scaler(torch.device("cpu"), "fp16") is None  # a scaler only for fp16 on CUDA


@pytest.mark.parametrize("T", [8, 160])  # the math path, and (T >= 128) the blocked path's fall-back in bf16
def test_attention_under_bf16_autocast_trains_the_prior_and_stays_near_float32(T):
    torch.manual_seed(0)
    attn = Attention(32, 2, MaskPrior(torch.rand(T, T)))
    x = torch.randn(2, T, 32)
    y32, _ = attn(x)
    with devices.autocast(torch.device("cpu"), "bf16"):
        y16, _ = attn(x)
    assert y16.dtype == torch.bfloat16
    assert (y16.float() - y32).abs().max().item() < 5e-2  # bf16: 8 mantissa bits
    y16.float().sum().backward()
    assert attn.prior.m.grad is not None and torch.isfinite(attn.prior.m.grad).all()
    assert attn.prior.m.dtype == torch.float32  # parameters stay float32 under autocast


def _spec(**kw):
    return asdict(specs_for(Config(**{**TINY, **kw}))[0])


def test_run_records_and_environment_say_where_runs_computed(tmp_path):
    specs = specs_for(Config(**TINY))
    res = run_study("gotu", {}, specs, "masklab.lab.studies.gotu:run_one", tmp_path, progress=False, device="cpu")
    env, rec = res["environment"], res["runs"][0]
    assert env["device"] == rec["device"] == "cpu"
    assert env["device_name"] == rec["device_name"] and env["precision"] == rec["precision"] == "fp32"
    assert "device" not in rec["spec"]["params"]  # the spec (and the run's key) does not name the CPU


def test_a_run_made_on_another_device_or_precision_is_run_again(tmp_path, monkeypatch):
    specs = specs_for(Config(**TINY))
    run_study("gotu", {}, specs, "masklab.lab.studies.gotu:run_one", tmp_path, progress=False)
    path = tmp_path / "runs" / f"{specs[0].key}.json"
    calls = []
    monkeypatch.setattr(executors, "execute", lambda *a, **k: calls.append(1) or execute(*a, **k))
    run_study("gotu", {}, specs, "masklab.lab.studies.gotu:run_one", tmp_path, progress=False)
    assert calls == []  # same device and precision: resumed
    rec = read_json(path)
    rec["device"] = "cuda"
    from masklab.util.files import write_json

    write_json(path, rec)
    run_study("gotu", {}, specs, "masklab.lab.studies.gotu:run_one", tmp_path, progress=False)
    assert calls == [1] and read_json(path)["device"] == "cpu"
    del rec["device"], rec["precision"], rec["device_name"]  # a record from before devices: the CPU in fp32
    write_json(path, rec)
    run_study("gotu", {}, specs, "masklab.lab.studies.gotu:run_one", tmp_path, progress=False)
    assert calls == [1]


def test_worker_takes_the_device_and_precision(tmp_path):
    from masklab.util.files import write_json
    from masklab.lab.worker import main as worker

    spec = _spec()
    write_json(tmp_path / "spec.json", spec)
    assert (
        worker(
            [
                "masklab.lab.studies.gotu:run_one",
                str(tmp_path / "spec.json"),
                str(tmp_path / "r.json"),
                "1",
                "cpu",
                "bf16",
            ]
        )
        == 0
    )
    rec = read_json(tmp_path / "r.json")
    assert rec["precision"] == "bf16" and rec["device"] == "cpu"
    assert all(v is None or v == v for v in rec["curves"]["train_loss"])  # finite (no NaN) under bf16 autocast
    assert (
        worker(["masklab.lab.studies.gotu:run_one", str(tmp_path / "spec.json"), str(tmp_path / "r2.json"), "1"]) == 0
    )
    assert read_json(tmp_path / "r2.json")["precision"] == "fp32"


def test_cpu_numbers_do_not_depend_on_naming_the_device(tmp_path):
    a = run_one(_spec(), tmp_path / "a")
    with devices.using("cpu"):
        b = run_one(_spec(), tmp_path / "b")
    assert a["metrics"] == b["metrics"] and a["curves"] == b["curves"]


def test_a_study_whose_passes_do_not_autocast_refuses_bf16_instead_of_recording_it(tmp_path):
    with devices.using("cpu", "bf16"), pytest.raises(MasklabError, match="evidence computes in fp32 only"):
        run_study("evidence", {}, [], "masklab.lab.studies.evidence:run_one", tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()
    with devices.using("cpu", "bf16"):  # gotu trains through masklab/lab/train.py, which autocasts
        res = run_study("gotu", {}, [], "masklab.lab.studies.gotu:run_one", tmp_path / "b", progress=False)
    assert res["environment"]["precision"] == "bf16"


def test_a_cpu_only_study_falls_back_to_the_cpu_under_auto_and_refuses_cuda(tmp_path, monkeypatch):
    from masklab.lab.studies import evidence

    monkeypatch.setattr(devices, "cuda_available", lambda: True)  # pretend: nothing below touches the GPU
    monkeypatch.delattr(evidence, "DEVICES")  # a study that declares no DEVICES runs on the CPU only
    fn = "masklab.lab.studies.evidence:run_one"
    with devices.using("auto"):
        assert devices.current().type == "cuda"
        res = run_study("evidence", {}, [], fn, tmp_path / "a", progress=False)
    assert res["environment"]["device"] == "cpu"
    with devices.using("cuda"), pytest.raises(MasklabError, match="evidence runs on cpu only.*use --device cpu"):
        run_study("evidence", {}, [], fn, tmp_path / "b", progress=False)
    assert devices.for_study("gotu", ("cpu", "cuda")) is None


def test_results_md_names_the_device_only_off_the_cpu_in_fp32():
    from masklab.lab.report import environment_line

    env = {"python": "3.11", "torch": "2.13.0", "cpus": 2, "git_rev": "abc"}
    res = {"environment": env, "runs": [{"seconds": 1.0}], "code": {"c0de": 1}}
    assert environment_line(res).startswith("Environment: python 3.11")
    assert environment_line(
        {**res, "environment": {**env, "device": "cpu", "precision": "fp32", "device_name": "X"}}
    ) == environment_line(res)
    gpu = {**env, "device": "cuda", "precision": "bf16", "device_name": "NVIDIA H200"}
    assert environment_line({**res, "environment": gpu}).startswith(
        "Environment: NVIDIA H200 (cuda, bf16), python 3.11"
    )


# ----------------------------------------------------------------------------- GPU
# The studies on CUDA against the same runs on the CPU (same draws: batches are drawn on the
# CPU). Tolerances: accuracies 0.02 (a few of 4096+ points may change sign), MSEs and losses
# 1e-3 absolute after these few steps; bf16 only has to train (finite losses).


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("method", ["mask", "qk-svd"])
def test_gpu_gotu_run_equals_the_cpu_run(method, tmp_path):
    spec = _spec(methods=[method], steps=30, evals=3)
    cpu = run_one(spec, tmp_path / "cpu")
    with devices.using("cuda"):
        gpu = run_one(spec, tmp_path / "gpu")
    for name in ("unseen_acc", "full_acc", "seen_acc"):
        assert abs(gpu["metrics"][name] - cpu["metrics"][name]) <= 0.02, name
    for name in ("train_mse", "unseen_mse"):
        assert abs(gpu["metrics"][name] - cpu["metrics"][name]) <= 1e-3, name
    assert max(abs(a - b) for a, b in zip(gpu["curves"]["train_loss"][1:], cpu["curves"]["train_loss"][1:])) <= 1e-3


@pytest.mark.gpu
@needs_gpu
def test_gpu_arith_run_equals_the_cpu_run_and_bf16_trains(tmp_path):
    from masklab.lab.studies import arith

    spec = asdict(arith.specs_for(arith.quick_config())[0])
    spec["params"].update(steps=20, evals=2)
    cpu = arith.run_one(spec, tmp_path / "cpu")
    with devices.using("cuda"):
        gpu = arith.run_one(spec, tmp_path / "gpu")
    with devices.using("cuda", "bf16"):
        bf16 = arith.run_one(spec, tmp_path / "bf16")
    assert abs(gpu["metrics"]["final_train_loss"] - cpu["metrics"]["final_train_loss"]) <= 1e-3
    assert abs(gpu["metrics"]["digit_acc"] - cpu["metrics"]["digit_acc"]) <= 0.02
    assert all(v is None or v == v for v in bf16["curves"]["train_loss"])


@pytest.mark.gpu
@needs_gpu
def test_gpu_study_through_the_cli_records_the_gpu(tmp_path, capsys):
    assert (
        cli.main(
            [
                "gotu",
                "--quick",
                "--task",
                "2parity",
                "--method",
                "mask",
                "--steps",
                "20",
                "--evals",
                "2",
                "--device",
                "cuda",
                "--jobs",
                "2",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    res = read_json(tmp_path / "results.json")
    assert res["environment"]["device"] == "cuda" and all(r["device"] == "cuda" for r in res["runs"])
    assert res["environment"]["device_name"] == torch.cuda.get_device_name(0)


@pytest.mark.gpu
@needs_gpu
def test_gpu_evidence_and_routing_runs_equal_the_cpu_runs(tmp_path):
    """The teacher and the routers train on CUDA (examples drawn on the CPU): teacher losses within
    1e-3 over the first curve points, accuracies and recalls within 0.05 (a few examples of 60 may
    flip after 200 steps)."""
    from masklab.lab.studies import evidence, routing

    cfg = evidence.Config(
        tasks=["kv"],
        items=6,
        vocab=32,
        dim=16,
        depth=2,
        heads=2,
        teacher_steps=200,
        examples=60,
        max_factor=1,
        cache=str(tmp_path / "cache"),
    )
    spec = asdict(evidence.specs_for(cfg)[0])
    cpu = evidence.run_one(spec, tmp_path / "cpu")
    with devices.using("cuda"):
        gpu = evidence.run_one(spec, tmp_path / "gpu")
    assert gpu["extra"]["teacher_key"] != cpu["extra"]["teacher_key"]  # cached apart
    assert max(abs(a - b) for a, b in zip(gpu["curves"]["loss"][:3], cpu["curves"]["loss"][:3])) <= 1e-3
    for name in ("teacher_acc", "loo|recall", "last-mean/topk|recall"):
        assert abs(gpu["metrics"][name] - cpu["metrics"][name]) <= 0.05, name
    rcfg = routing.Config(
        tasks=["kv"],
        items=6,
        vocab=32,
        depth=2,
        teacher_steps=200,
        router_steps=50,
        pool=256,
        examples=60,
        targets=["gold"],
        independent_targets=[],
        seeds=[0],
        lengths=[1],
        budgets=["1"],
        max_factor=1,
        cache=str(tmp_path / "cache"),
    )
    cpu_res = routing.run(rcfg, tmp_path / "routing-cpu", progress=False)
    with devices.using("cuda"):
        gpu_res = routing.run(rcfg, tmp_path / "routing-cuda", progress=False)
    assert gpu_res["environment"]["device"] == "cuda"
    cpu_runs, gpu_runs = ({r["method"]: r["metrics"] for r in res["runs"]} for res in (cpu_res, gpu_res))
    for method in ("router/gold", "baselines"):
        key = "acc_1x" if method == "router/gold" else "teacher-attention|acc_1x"
        assert abs(gpu_runs[method][key] - cpu_runs[method][key]) <= 0.05, method


@pytest.mark.gpu
@needs_gpu
@needs_smol
def test_gpu_real_lm_studies_equal_the_cpu_runs(tmp_path):
    """stale, tune-prior (prior, 3 steps) and longctx on CUDA against the same runs on the CPU,
    float32: the same greedy answers, losses within 1e-3; longctx records the GPU's peak memory."""
    from masklab.lab.studies import longctx, stale, tune_prior

    runs = [
        (stale, stale.Config(models=["smollm2-135m"], prompts=3), ("accuracy", "n_correct")),
        (
            tune_prior,
            tune_prior.Config(
                models=["smollm2-135m"], methods=["prior"], train_prompts=4, test_prompts=2, steps=3, ppl_tokens=32
            ),
            ("accuracy",),
        ),
        (
            longctx,
            longctx.Config(tasks=["niah"], lengths=[256], examples=1, routers=["lexical"], compare=[]),
            ("acc|full", "acc|lexical@0.25"),
        ),
    ]
    for mod, cfg, same in runs:
        spec = asdict(mod.specs_for(cfg)[0])
        (tmp_path / mod.NAME / "cpu").mkdir(parents=True)
        (tmp_path / mod.NAME / "gpu").mkdir()
        cpu = mod.run_one(spec, tmp_path / mod.NAME / "cpu")
        with devices.using("cuda"):
            gpu = mod.run_one(spec, tmp_path / mod.NAME / "gpu")
        for name in same:
            assert gpu["metrics"][name] == cpu["metrics"][name], (mod.NAME, name)
        if mod is tune_prior:
            assert abs(gpu["metrics"]["loss_first"] - cpu["metrics"]["loss_first"]) <= 1e-3
        if mod is longctx:
            assert gpu["metrics"]["gpu_peak_mb"] > 0 and "gpu_peak_mb" not in cpu["metrics"]


@pytest.mark.gpu
@needs_gpu
@needs_smol
def test_gpu_train_router_records_the_gpu(tmp_path):
    from masklab.context.routers.features import load_routers

    assert (
        cli.main(
            ["train-router", "--quick", "--length", "256", "--device", "cuda", "--out", str(tmp_path), "--no-progress"]
        )
        == 0
    )
    _, meta = load_routers(tmp_path / "smollm2-135m")
    assert meta["device"]["device"] == "cuda" and meta["device"]["device_name"] == torch.cuda.get_device_name(0)
