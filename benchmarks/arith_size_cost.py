"""CPU cost of `masklab sweep arith-size`, per model size, from which its total is estimated.

    python benchmarks/arith_size_cost.py [--out benchmarks/arith_size_cost.json]

One thread. Per size (width and depth x1, x2, x4, the mask model): CPU seconds of one
training step (batch 128, mean of 20 after one warm-up step) and of greedily decoding 1000
held-out pairs. Then one whole x1 run (vanilla, seed 0, the sweep's recipe) checks the
formula ``run = 2500 * step + 23 * decode_1000 (+ setup)``: 23,000 pairs are decoded per run
(11 curve evaluations of 1000, the 10,000 test pairs and 2000 training pairs). Writes the
per-size figures, the estimated run and sweep CPU seconds, the measured x1 run and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from masklab.models import GPT
from masklab.lab.studies import arith, arith_size
from masklab.lab.tasks.arithmetic import VOCAB, greedy_results, inputs_targets, make_split
from masklab.lab.train import priors_for

DECODED = 11 * arith.CURVE_PROBE + 10_000 + arith.TRAIN_PROBE  # pairs decoded by one run at the defaults


def per_size(k: int, x: torch.Tensor, y: torch.Tensor, test: list) -> dict:
    p = arith_size.specs_for(arith_size.Config(methods=["mask"], seeds=[0], sizes=[[k, k]]))[0].params
    model = GPT(VOCAB, x.shape[1], p["dim"], p["depth"], p["heads"], priors_for("mask", arith.structures_for(p)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        idx = torch.randint(len(x), (128,), generator=gen)
        loss = F.cross_entropy(model(x[idx])[0].flatten(0, 1), y[idx].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    c0 = time.process_time()
    for _ in range(20):
        step()
    step_s = (time.process_time() - c0) / 20
    model.eval()
    c0 = time.process_time()
    with torch.no_grad():
        greedy_results(model, test[:1000], 3)
    decode_s = time.process_time() - c0
    return {
        "dim": p["dim"],
        "depth": p["depth"],
        "parameters": sum(q.numel() for q in model.parameters()),
        "step_cpu_s": step_s,
        "decode_1000_cpu_s": decode_s,
        "run_cpu_s_estimate": p["steps"] * step_s + DECODED / 1000 * decode_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/arith_size_cost.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    split = make_split("add", 3, 0.004, 1000, 0, False)
    x, y = inputs_targets(split.sequences("train"), 3)
    sizes = {f"x{k}": per_size(k, x, y, split.sequences("test")) for k in (1, 2, 4)}
    cfg = arith_size.reproduce_config()
    runs_per_size = len(cfg.methods) * len(cfg.seeds)
    total = sum(s["run_cpu_s_estimate"] * runs_per_size for s in sizes.values())
    spec = arith_size.specs_for(arith_size.Config(methods=["vanilla"], seeds=[0], sizes=[[1, 1]]))[0].as_dict()
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        r = arith.run_one(spec, Path(d) / "ckpt")
    result = {
        "command": "python benchmarks/arith_size_cost.py",
        "threads": 1,
        "sizes": sizes,
        "runs_per_size": runs_per_size,
        "sweep_cpu_s_estimate": total,
        "sweep_wall_s_estimate_jobs2_idle": total / 2,
        "x1_vanilla_run": {
            "cpu_s": r["metrics"]["cpu_seconds"],
            "wall_s": time.perf_counter() - t,
            "exact_acc": r["metrics"]["exact_acc"],
        },
        "load_average": [load0, os.getloadavg()[0]],
        "cpus": os.cpu_count(),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
