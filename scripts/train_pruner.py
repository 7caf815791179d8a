"""Train the pruner's variants on the corpus labels and choose on val only.

    python scripts/train_pruner.py [--model smollm2-135m] [--designs head,lora] [--thresholds 0.5,1,2] [--ship]

Reads ``results/corpus-labels/labels-MODEL-train.jsonl`` (:mod:`masklab.lab.labels`), builds
one training question per labelled question (its window's units, the target set of each label
variant, :func:`masklab.lab.train_pruner.target_set`), and trains every design x causal threshold
on the causal labels. Val (never trained on): the corpus's ``val`` documents and the benchmark's
``val`` split, the writers' marked answering units as the truth, units cut with MODEL's
tokenizer; measured: MRR and the answer kept at keep 0.1. The rule, fixed before the val
results were read: the design and threshold with the best pooled val MRR; the attention and
marks variants are then trained with that design and threshold (and for attention the same
number of units per question), so the three differ only in their labels. ``--keep auto``'s
score threshold is the one on val whose mean kept fraction is the smallest keeping the answer
at least as often as keep 0.25 does. Writes ``results/pruner/results.json`` (every candidate's
val figures, the choice, training seconds) and with ``--ship`` the three chosen pruners to
``masklab/context/weights/pruner/LABELS.safetensors`` (+ ``.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    from masklab.lab.train_pruner import TrainConfig, examples_of, keep_auto, save, train, val_figures
    from masklab.text.document import segment
    from masklab.pretrained.models import load
    from masklab.lab.revision import code_hash
    from masklab.lab.tasks import realdocs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default="smollm2-135m", help="the model whose labels train (and whose tokenizer cuts units)"
    )
    ap.add_argument("--designs", default="head,lora", help="comma-separated: head, lora")
    ap.add_argument("--thresholds", default="0.5,1,2", help="causal set floors in nats, comma-separated")
    ap.add_argument(
        "--epochs", type=int, default=None, help="training epochs (default: 12 for the head, 3 for the adapters)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--ship", action="store_true", help="write the chosen pruners into masklab/context/weights")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = load(a.model, threads=a.threads).tokenizer
    files = sorted((ROOT / "results" / "corpus-labels").glob(f"labels-{a.model}-train*.jsonl"))
    rows = list({r["key"]: r for f in files for r in map(json.loads, f.open())}.values())
    corpus = {q.id: q for q in realdocs.load("all", realdocs.CORPUS)}
    docs: dict = {}
    for q in list(corpus.values()) + realdocs.load("val"):
        if q.doc not in docs:
            docs[q.doc] = segment(q.text, tok)
    questions = {r["id"]: corpus[r["id"]] for r in rows}
    val = realdocs.load("val", realdocs.CORPUS) + realdocs.load("val")
    print(f"{len(rows)} labelled training questions; val: {len(val)} questions", file=sys.stderr)

    from masklab.context.embedder import load_embedder

    emb = load_embedder()
    base = val_figures(lambda q, u: emb.units(u) @ emb.query(q), val, docs, tok)
    out = {
        "command": "python scripts/train_pruner.py " + " ".join(sys.argv[1:]),
        "model": a.model,
        "labelled": len(rows),
        "val_questions": len(val),
        "code": [code_hash("masklab.context.pruner")],
        "summary": [{"task": "val", "method": "dense", **{k: v for k, v in base.items() if k != "rows"}}],
    }
    trained = {}
    for design in a.designs.split(","):
        for th in (float(x) for x in a.thresholds.split(",")):
            cfg = TrainConfig(design=design, labels="causal", threshold=th, epochs=a.epochs)
            t0 = time.perf_counter()
            model, rec = train(examples_of(rows, questions, tok, "causal", th), cfg, a.progress)
            fig = val_figures(model.rank, val, docs, tok)
            trained[(design, th)] = (model, fig, rec)
            out["summary"].append(
                {
                    "task": "val",
                    "method": f"pruner {design} causal>={th:g}",
                    "design": design,
                    "threshold": th,
                    "labels": "causal",
                    "train_examples": rec["examples"],
                    "train_seconds": time.perf_counter() - t0,
                    "loss": rec["loss"],
                    **{k: v for k, v in fig.items() if k != "rows"},
                }
            )
            print(
                out["summary"][-1]["method"],
                {k: round(v, 3) for k, v in fig.items() if k in ("mrr", "kept@10", "kept@25")},
                file=sys.stderr,
            )
    (design, th), (model, fig, rec) = max(trained.items(), key=lambda kv: kv[1][1]["mrr"])
    out["chosen"] = {"design": design, "threshold": th}
    chosen = {"causal": (model, fig, rec)}
    for labels in ("attention", "marks"):
        m, r = train(
            examples_of(rows, questions, tok, labels, th),
            TrainConfig(design=design, labels=labels, threshold=th, epochs=a.epochs),
            a.progress,
        )
        f = val_figures(m.rank, val, docs, tok)
        chosen[labels] = (m, f, r)
        out["summary"].append(
            {
                "task": "val",
                "method": f"pruner {design} {labels}",
                "design": design,
                "threshold": th,
                "labels": labels,
                "train_examples": r["examples"],
                "train_seconds": r["seconds"],
                "loss": r["loss"],
                **{k: v for k, v in f.items() if k != "rows"},
            }
        )
    for labels, (m, f, r) in chosen.items():
        auto = keep_auto(f["rows"], f["kept@25"])
        out["summary"].append({"task": "val-keep-auto", "method": f"pruner {design} {labels}", **(auto or {})})
        if a.ship:
            meta = {
                "labels": labels,
                "threshold": th,
                "model": a.model,
                "labelled": len(rows),
                "train_examples": r["examples"],
                "epochs": r["epochs"],
                "keep_auto": auto and auto["threshold"],
                "val": {k: v for k, v in f.items() if k != "rows"},
                "code": out["code"][0],
                "command": out["command"],
            }
            save(m, ROOT / "masklab" / "context" / "weights" / "pruner" / f"{labels}.safetensors", meta)
    from masklab.util.files import write_json

    write_json(ROOT / "results" / "pruner" / "results.json", out)
    for s in out["summary"]:
        print(
            f"{s['task']:14s} {s['method']:28s} "
            + " ".join(
                f"{k} {s[k]:.3f}"
                for k in ("mrr", "kept@10", "kept@25", "threshold", "fraction", "kept")
                if isinstance(s.get(k), float)
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
