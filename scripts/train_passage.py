"""Train the passage pruner's head (``pruner-passage``) and its controls on the corpus labels; measure on val only.

    python scripts/train_passage.py [--model smollm2-135m] [--epochs 60] [--threads 1] [--ship two-hop]

What it runs is :func:`masklab.lab.train_passage.run` (its module docstring has the method): the variants
``two-hop``, ``one-hop`` and ``unit`` trained on the same questions and targets, beside the shipped
``pruner-ctx`` and the round-5 ``pruner``, on the corpus's val questions. Writes ``results/passage/results.json``
(per-question scores, wall and CPU seconds) and each variant's head beside it; ``--ship VARIANT`` also writes that
head to ``masklab/context/weights/pruner/passage.safetensors`` (the one ``pruner-passage`` reads).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    from masklab.lab.train_ctx import HeadConfig
    from masklab.lab.train_passage import VARIANTS, run, summary_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="the model whose labels train (its tokenizer cuts units)")
    ap.add_argument("--epochs", type=int, default=HeadConfig.epochs, help="training epochs of each head")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--ship", choices=sorted(VARIANTS), help="the variant to copy into masklab/context/weights/pruner")
    ap.add_argument("--labels", default="union", choices=("union", "marks"), help="the targets: causal or the marks")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "passage", help="where results.json goes")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    res = run(a.model, a.out, "python scripts/train_passage.py " + " ".join(sys.argv[1:]), a.epochs, a.ship, a.labels)
    print(summary_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
