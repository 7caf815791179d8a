"""End-to-end answer latency: router + sparse teacher vs the dense teacher (ratios in one run).

    python benchmarks/routing_latency.py [--items 64,256,1024] [--budget 10%] [--batch 1,32] [--reps 15]

For every context size n and batch size: the dense teacher (the routing study's default
``EvidenceReader``: width 64, depth 4) reads all n items; the routed path runs the default
``transformer`` router (width 32, depth 3, 4 heads) over all n items, keeps the budget (top 10% by
default) and lets the teacher read only the kept items (dropped from the sequence). Both are
timed interleaved (median of ``reps``), so machine noise hits both; latency does not depend
on the weights, so untrained models of the right shapes are used. Prints the FLOPs ratio by
formula beside the measured speed-up (goal: >= 5x at 4N with a 10% budget; accuracy at that
budget comes from ``masklab reproduce routing``). ``--json PATH`` also writes the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from masklab.lab.evidence.interventions import answer_logits
from masklab.lab.evidence.teacher import TeacherConfig, build_teacher
from masklab.lab.routing import build_router, keep_mask, parse_budget
from masklab.lab.routing.sparse import teacher_flops
from masklab.lab.tasks.evidence_gyms import make_gym


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", default="64,256,1024")
    ap.add_argument("--budget", default="10%")
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--router-dim", type=int, default=32)
    ap.add_argument("--router-depth", type=int, default=3)
    ap.add_argument("--router-heads", type=int, default=4)
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    budget = parse_budget(args.budget)
    rows = []
    print(
        f"threads={args.threads} budget={args.budget} teacher 64x4, "
        f"router {args.router_dim}x{args.router_depth} ({args.router_heads} heads)"
    )
    print(f"{'items':>6} {'batch':>5} {'dense ms':>9} {'routed ms':>10} {'speed-up':>9} {'FLOPs ratio':>12}")
    for n in (int(x) for x in args.items.split(",")):
        teacher = build_teacher(TeacherConfig(task="kv", items=n, max_factor=1, vocab=max(256, n + 2))).eval()
        router = build_router(
            "transformer", teacher.vocab, args.router_dim, args.router_depth, args.router_heads
        ).eval()
        for B in (int(x) for x in args.batch.split(",")):
            b = make_gym("kv", teacher.vocab).sample(B, n, np.random.default_rng(n))

            @torch.no_grad()
            def dense():
                answer_logits(teacher, b)

            @torch.no_grad()
            def routed():
                s = router(b.items, b.query, b.valid, b.positions)
                answer_logits(teacher, b, keep_mask(s, b.valid, budget), "delete")

            times = {"dense": [], "routed": []}
            for rep in range(args.reps + 2):
                for name, fn in (("dense", dense), ("routed", routed)):
                    t = time.perf_counter()
                    fn()
                    if rep >= 2:  # warm-up
                        times[name].append(time.perf_counter() - t)
            d, r = statistics.median(times["dense"]), statistics.median(times["routed"])
            k = int(keep_mask(torch.zeros(1, n), torch.ones(1, n, dtype=torch.bool), budget).sum())
            flops = (router.flops(n) + teacher_flops(teacher, k)) / teacher_flops(teacher, n)
            rows.append(
                {
                    "items": n,
                    "batch": B,
                    "dense_ms": d * 1e3,
                    "routed_ms": r * 1e3,
                    "speedup": d / r,
                    "flops_ratio": flops,
                    "kept": k,
                }
            )
            print(f"{n:>6} {B:>5} {d * 1e3:>9.2f} {r * 1e3:>10.2f} {d / r:>8.2f}x {flops:>12.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
