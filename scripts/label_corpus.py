"""Causal and attention labels of the pruner's training corpus (``masklab/data/corpus``, split
``train``), resumable: ``results/corpus-labels/labels-MODEL.jsonl`` (one line per question,
:mod:`masklab.lab.labels`). Questions are taken in turn from each document, so a partial run
covers every document.

    python scripts/label_corpus.py [--model smollm2-135m] [--split train] [--labels lasso|keepset] [--kinds two,latest] [--minutes M] [--shard I/N]

``--labels keepset`` writes ``labels-keepset-MODEL-SPLIT.jsonl`` (leave-one-in and pair labels,
:func:`masklab.lab.labels.keepset_label`) beside the random-ablation files.

``--shard I/N`` labels every N-th question from the I-th on into a file of its own
(``labels-MODEL-SPLIT-I.jsonl``), so N processes label apart; ``scripts/train_pruner.py`` reads them all.
A question already labelled in another file of the same labels (an earlier run's shards) is not
labelled again: questions added to the corpus later land in the file this run writes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> int:
    from masklab.lab.labels import ABLATIONS, LABELLERS, WINDOW_TOP, label_questions, question_key
    from masklab.util.files import read_jsonl
    from masklab.lab.realdocs import in_turn
    from masklab.pretrained.models import load
    from masklab.lab.tasks import realdocs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="the answering model whose needs are labelled")
    ap.add_argument("--split", default="train", choices=["train", "val"], help="corpus split")
    ap.add_argument("--labels", default="lasso", choices=LABELLERS, help="lasso: random ablations and a sparse linear "
                    "surrogate (round 5); keepset: each unit and the best pairs read alone (credits two-unit evidence)")
    ap.add_argument("--kinds", default=None, help="comma-separated question kinds to label (single, two, latest; "
                    "default all)")
    ap.add_argument("--minutes", type=float, default=None, help="stop after the question that passes this many minutes")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"], help="autocast of the model's passes "
                    "(bf16 halves a pass on this CPU; each row records its precision)")
    ap.add_argument("--shard", default=None, metavar="I/N", help="label only questions I, I+N, ... (0-based)")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lm = load(a.model, threads=a.threads)
    out = Path(__file__).resolve().parent.parent / "results" / "corpus-labels"
    out.mkdir(parents=True, exist_ok=True)
    qs = in_turn(realdocs.load(a.split, realdocs.CORPUS))
    if a.kinds:
        qs = [q for q in qs if q.kind in a.kinds.split(",")]
    name = f"labels-{lm.name}-{a.split}" if a.labels == "lasso" else f"labels-keepset-{lm.name}-{a.split}"
    if a.shard:
        i, n = (int(x) for x in a.shard.split("/"))
        qs, name = qs[i::n], f"{name}-{i}"
    base = name if not a.shard else name.rsplit("-", 1)[0]
    elsewhere = {r["key"] for f in out.glob(f"{base}*.jsonl") if f.name != f"{name}.jsonl" for r in read_jsonl(f)}
    qs = [q for q in qs if question_key(q) not in elsewhere]
    t0, c0 = time.perf_counter(), time.process_time()
    from masklab.util import device as devices

    with devices.using("cpu", a.precision), devices.autocast(torch.device("cpu"), a.precision):
        rows = label_questions(lm, qs, out / f"{name}.jsonl", WINDOW_TOP, ABLATIONS, a.progress,
                               None if a.minutes is None else a.minutes * 60, labels=a.labels)
    print(json.dumps({"model": lm.name, "split": a.split, "labelled": len(rows), "of": len(qs),
                      "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                      "seconds_per_question": sum(r["seconds"] for r in rows) / max(1, len(rows)),
                      "passes_per_question": sum(r["passes"] for r in rows) / max(1, len(rows))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
