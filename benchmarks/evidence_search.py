"""Evidence-extraction cost: loo vs group-testing vs greedy-minimal at N = 16, 64, 256 items.

For each N and method: forward passes per example (sequences evaluated), model calls per
example (batched forward passes), examples per second (wall clock, one torch thread), and the
agreement of each method's sets with loo (exact-set match, mean Jaccard). Group testing's
goal: the loo set with <= k*ceil(log2 N)+1 passes (k = |loo set|); we report the fraction of
examples within that bound and within the implementation's k*(ceil(log2 N)+1)+1.

Model: the cached ``stale`` teacher of the evidence study (trained at N=16 with the length
curriculum to 4N = 64) where it can read the context (N <= 64). At N = 256 no teacher here
reads that far, so the *cost* is measured on an untrained reader of the same size (cost
does not depend on the weights) and its agreement numbers are marked ``untrained``.

    .venv/bin/python benchmarks/evidence_search.py [--quick] [--cache cache] [--out benchmarks/evidence_search.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from masklab.lab.evidence import SEARCHES, evidence_sets  # noqa: E402
from masklab.lab.evidence.teacher import TeacherConfig, gym_of, load_or_train  # noqa: E402
from masklab.models.reader import EvidenceReader  # noqa: E402
from masklab.lab.studies import evidence  # noqa: E402


class CountingModel(torch.nn.Module):
    """Wraps a reader and counts batched calls (model invocations)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, *args, **kw):
        self.calls += 1
        return self.model(*args, **kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cache", default="cache")
    ap.add_argument("--teacher-steps", type=int, help="default: the evidence study's stale recipe")
    ap.add_argument("--out", default="benchmarks/evidence_search.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = evidence.specs_for(evidence.Config(tasks=["stale"], teacher_steps=args.teacher_steps))[0]
    cfg = evidence.teacher_config(
        spec.params, "stale", 0, spec.seed
    )  # the evidence study's stale teacher (same cache key)
    teacher, info = load_or_train(cfg, Path(args.cache))
    sizes = {16: 48, 64: 16, 256: 4} if not args.quick else {16: 8, 64: 4, 256: 1}
    rows = []
    for n, examples in sizes.items():
        trained = n <= cfg.max_items
        if trained:
            model, gym = teacher, gym_of(cfg)
        else:
            torch.manual_seed(0)
            model, gym = (
                EvidenceReader(2 * n, n, cfg.dim, cfg.depth, cfg.heads, cfg.recency).eval(),
                gym_of(TeacherConfig(task="stale", vocab=2 * n)),
            )
        batch = gym.sample(examples, n, np.random.default_rng(n))
        sets = {}
        for method in SEARCHES:
            counted = CountingModel(model)
            t = time.perf_counter()
            evs = evidence_sets(counted, batch, method)
            sec = time.perf_counter() - t
            sets[method] = evs
            rows.append(
                {
                    "n": n,
                    "method": method,
                    "model": "teacher" if trained else "untrained",
                    "passes_per_example": float(np.mean([e.forward_passes for e in evs])),
                    "calls_per_example": (counted.calls - 1) / examples,  # minus the dense pass
                    "examples_per_s": examples / sec,
                    "set_size": float(np.mean([len(e.items) for e in evs])),
                }
            )
        loo = sets["loo"]
        for row in rows[-len(SEARCHES) :]:
            other = sets[row["method"]]
            row["exact_vs_loo"] = float(np.mean([a.items == b.items for a, b in zip(other, loo)]))
            row["jaccard_vs_loo"] = float(
                np.mean(
                    [
                        len(set(a.items) & set(b.items)) / len(set(a.items) | set(b.items))
                        if (a.items or b.items)
                        else 1.0
                        for a, b in zip(other, loo)
                    ]
                )
            )
            if row["method"] == "group-testing":
                ks = [len(e.items) for e in loo]
                ps = [e.forward_passes for e in other]
                row["within_k_log2n_plus_1"] = float(
                    np.mean([p <= k * math.ceil(math.log2(n)) + 1 for p, k in zip(ps, ks)])
                )
                row["within_k_log2n_plus_k_plus_1"] = float(
                    np.mean([p <= k * (math.ceil(math.log2(n)) + 1) + 1 for p, k in zip(ps, ks)])
                )
    for n in sizes:
        loo_speed = next(r["examples_per_s"] for r in rows if r["n"] == n and r["method"] == "loo")
        for r in rows:
            if r["n"] == n:
                r["speed_vs_loo"] = r["examples_per_s"] / loo_speed
    head = [
        "n",
        "method",
        "model",
        "passes_per_example",
        "calls_per_example",
        "examples_per_s",
        "speed_vs_loo",
        "set_size",
        "exact_vs_loo",
        "jaccard_vs_loo",
        "within_k_log2n_plus_1",
        "within_k_log2n_plus_k_plus_1",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(f"{r.get(h):.3g}" if isinstance(r.get(h), float) else str(r.get(h, "-")) for h in head)
            + " |"
        )
    table = "\n".join(lines)
    print(f"teacher: stale, acc at N={cfg.items} {info['acc_n']:.3f}, at {cfg.max_items} {info['acc_max']}")
    print(table)
    Path(args.out).write_text(
        json.dumps({"teacher": {k: info[k] for k in ("acc_n", "acc_max")}, "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
