"""Causal and attention labels of the pruner's training corpus (``masklab/data/corpus``, split
``train``), resumable: ``results/corpus-labels/labels-MODEL-SPLIT-I.jsonl`` (one line per question,
:mod:`masklab.lab.labels`). Questions are taken in turn from each document, so a partial run
covers every document.

    python scripts/label_corpus.py [--model smollm2-135m] [--split train] [--labels lasso|keepset] [--kinds two,bridge]
                                   [--minutes M] [--shards N] [--executor local|ray] [--jobs J]

The questions are cut into ``--shards`` shards, each one run of a study executed by
:mod:`masklab.lab.executors`: ``--jobs J`` runs J local worker processes, ``--executor ray``
spreads the shards over a Ray cluster (``--ray-address``; the output folder must be storage
every node sees). ``--labels keepset`` writes ``labels-keepset-MODEL-SPLIT-I.jsonl`` (leave-one-in
and pair labels, :func:`masklab.lab.labels.keepset_label`) beside the random-ablation files. A
question already labelled in another file of the same labels (an earlier run's shards) is not
labelled again: questions added to the corpus later land in the file this run writes. A killed
run continues where it stopped; ``scripts/train_pruner.py`` and ``train_ctx.py`` read every file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    from masklab.lab import executors
    from masklab.lab.labels import LABELLERS
    from masklab.lab.runner import run_study
    from masklab.lab.runs import RunSpec
    from masklab.lab.tasks import realdocs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="the answering model whose needs are labelled")
    ap.add_argument("--split", default="train", choices=["train", "val"], help="corpus split")
    ap.add_argument(
        "--labels",
        default="lasso",
        choices=LABELLERS,
        help="lasso: random ablations and a sparse linear "
        "surrogate; keepset: each unit and the best pairs read alone (credits evidence of several units)",
    )
    ap.add_argument(
        "--kinds",
        default=None,
        help=f"comma-separated question kinds to label ({', '.join(realdocs.KINDS)}; default all)",
    )
    ap.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="each shard stops after the question that passes this many minutes (the rest wait for the next run)",
    )
    ap.add_argument("--shards", type=int, default=1, help="shards of the questions, one run each")
    ap.add_argument("--executor", default="local", choices=executors.EXECUTORS, help="where the shards run")
    ap.add_argument(
        "--ray-address", default=None, help="a Ray cluster's address (--executor ray; default: a local one)"
    )
    ap.add_argument("--jobs", type=int, default=1, help="local worker processes (--executor local)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per shard")
    ap.add_argument(
        "--precision",
        default="bf16",
        choices=["fp32", "bf16"],
        help="autocast of the model's passes (bf16 halves a pass on this CPU; each row records its precision)",
    )
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    a = ap.parse_args()
    executors.use(a.executor, a.ray_address)
    out = ROOT / "results" / "corpus-labels"
    name = f"labels-{a.model}-{a.split}" if a.labels == "lasso" else f"labels-keepset-{a.model}-{a.split}"
    digest = realdocs.digest(realdocs.CORPUS)  # new questions: new runs (the files skip what is labelled)
    specs = [
        RunSpec(
            f"labels-{a.split}-{digest}",
            a.labels,
            i,
            model=a.model,
            params={
                "root": "corpus",
                "split": a.split,
                "labels": a.labels,
                "kinds": a.kinds,
                "shard": f"{i}/{a.shards}",
                "minutes": a.minutes,
                "base": name,
                "file": str(out / f"{name}-{digest}-{i}.jsonl"),
            },
        )
        for i in range(a.shards)
    ]
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_study(
        "labels",
        vars(a),
        specs,
        "masklab.lab.labels:label_shard",
        out / "runs-labels",
        jobs=a.jobs,
        threads=a.threads,
        progress=a.progress,
        precision=a.precision,
    )
    done = [r["metrics"] for r in res["runs"]]
    print(
        json.dumps(
            {
                "model": a.model,
                "split": a.split,
                "labelled": sum(m["labelled"] for m in done),
                "of": sum(m["of"] for m in done),
                "wall_s": time.perf_counter() - t0,
                "cpu_s": time.process_time() - c0,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
