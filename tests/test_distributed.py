"""torchrun with 2 processes (gloo, CPU) gives the single-process result for the same
global batch, and a killed distributed run resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

ARGS = [
    "vision",
    "--model",
    "cpu-micro",
    "--method",
    "mask",
    "--seed",
    "0",
    "--batch",
    "32",
    "--jobs",
    "1",
    "--no-progress",
]


def torchrun(args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "masklab",
        *args,
    ]


def single(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "masklab", *args]


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e.pop("WORLD_SIZE", None)
    return e


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in their own sessions)."""
    out: list[int] = []
    try:
        children = [
            int(c)
            for f in os.listdir(f"/proc/{pid}/task")
            for c in open(f"/proc/{pid}/task/{f}/children").read().split()
        ]
    except OSError:
        return out
    for c in children:
        out += [c, *descendants(c)]
    return out


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def only_run(out) -> dict:
    return json.loads((out / "results.json").read_text())["runs"][0]


def assert_same(a: dict, b: dict) -> None:
    for key in ("test_loss", "train_loss", "local_mass_final", "mask_drift"):
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], rel=1e-4, abs=1e-6), key
    assert a["curves"]["train_loss"][1:] == pytest.approx(b["curves"]["train_loss"][1:], rel=1e-4)
    assert abs(a["metrics"]["test_acc"] - b["metrics"]["test_acc"]) <= 0.5  # at most 2 of 445 test images


@pytest.mark.slow
def test_ddp_matches_single_process_and_resumes(tmp_path):
    steps = ["--steps", "40", "--evals", "4"]
    run(single([*ARGS, *steps, "--out", str(tmp_path / "single")]))
    run(torchrun([*ARGS, *steps, "--out", str(tmp_path / "ddp")]))
    ref, ddp = only_run(tmp_path / "single"), only_run(tmp_path / "ddp")
    assert ddp["extra"]["world_size"] == 2 and ref["extra"]["world_size"] == 1
    assert_same(ddp, ref)

    # kill a distributed run after its first checkpoint, then run the same command again
    out = tmp_path / "resumed"
    cmd = torchrun([*ARGS, *steps, "--out", str(out)])
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), start_new_session=True
    )  # noqa: S603
    ckpt = out / "ckpt" / "digits__mask__s0" / "ckpt.json"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists() and json.loads(ckpt.read_text())["step"] >= 10:
            break
        time.sleep(0.05)
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    time.sleep(0.5)
    if not ckpt.exists() or (out / "runs" / "digits__mask__s0.json").exists():
        pytest.fail("the distributed run finished or failed before it could be interrupted")
    run(cmd)
    resumed = only_run(out)
    assert resumed["extra"]["resumed_from"] >= 10
    assert_same(resumed, ref)
