"""Train the context pruner's label variants (``pruner-ctx``) on the corpus labels and measure them on val only.

    python scripts/train_ctx.py [--model smollm2-135m] [--labels lasso,keepset,union,attention,marks]
                                [--ship union,attention]

What it runs is :func:`masklab.lab.train_ctx.run_corpus` (its module docstring has the method); the
shipped default comes from ``masklab train-router --kind pruner-ctx``, which runs the same function for
one variant. Writes ``results/ctx/results.json`` (wall and CPU seconds included) and each variant's head
beside it; ``--ship`` also writes the named variants to
``masklab/context/weights/pruner/ctx-VARIANT.safetensors``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    from masklab.lab.train_ctx import VARIANTS, HeadConfig, run_corpus

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default="smollm2-135m", help="the model whose labels train (and whose tokenizer cuts units)"
    )
    ap.add_argument("--labels", default=",".join(VARIANTS), help="comma-separated variants: " + ", ".join(VARIANTS))
    ap.add_argument("--epochs", type=int, default=HeadConfig.epochs, help="training epochs")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--ship", default="", help="comma-separated variants to copy into masklab/context/weights/pruner")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    res = run_corpus(
        a.model,
        a.labels.split(","),
        ROOT / "results" / "ctx",
        "python scripts/train_ctx.py " + " ".join(sys.argv[1:]),
        a.epochs,
        a.threads,
        tuple(x for x in a.ship.split(",") if x),
    )
    for s in res["summary"]:
        print({k: round(x, 3) if isinstance(x, float) else x for k, x in s.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
