"""Train the cross-encoder pruner (the lab's ``cross`` router) on the corpus and measure it on val only.

    python scripts/train_cross.py [--labels marks,union,keepset,lasso,attention] [--common] [--epochs 2]
                                  [--minutes M] [--hops 1,2] [--threads 1] [--ship VARIANT]

Every weight of the packaged MiniLM and the keep head is fine-tuned (:func:`masklab.lab.cross.train`)
on the corpus's ``train`` questions, one model per label variant, everything else equal (the same
windows, encoder, steps and seed):

* ``marks``: the units the writers marked as answering (every question);
* ``keepset``: the units :func:`masklab.lab.labels.keepset_target` credits (the questions with keep-set
  labels, ``results/corpus-labels/labels-keepset-MODEL-train*.jsonl``);
* ``union``: both sets, the marks alone where a question has no keep-set labels;
* ``lasso`` / ``attention``: the random-ablation units above the shipped pruner's threshold, and as
  many of the most attended units (the control), on the questions with those labels.

A label row counts only for the wording of the question it was made for. ``--common`` trains every
listed variant on the same questions, those with labels of every variant (the controlled
comparison of the labels: ``VARIANT-common``).

Training checkpoints every 50 steps in ``runs/cross/ckpt-VARIANT-DATA/`` (outside the repository:
model and optimiser, about 270 MB); ``--minutes`` stops cleanly after that much time, and the same
command continues from the last checkpoint in a later session. A finished variant is stored in
``results/cross/VARIANT.safetensors`` and measured on val (the corpus's ``val`` documents and the
benchmark's ``val`` split; the writers' marks as the truth: MRR, kept@0.1, kept@0.25, each question's
scores), with one hop and with two (:meth:`masklab.context.router.Router.read_hops`), in
``results/cross/results.json`` with the wall and CPU seconds of each step. ``--ship VARIANT`` copies
that variant with its val figures, its ``keep_auto`` threshold and the hops that won on val to
``results/cross/shipped.safetensors`` (+ ``.json``, with the Platt scaling fitted on those val scores,
which the router applies): the file the lab's ``cross`` router is given (``path=``) and
``scripts/cross_val.py`` measures. No weights are packaged: the cross pruner ranks below ``pruner-ctx``
on val (docs/context.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from masklab.lab.train_ctx import KEEPSET_GAIN, VARIANTS

ROOT = Path(__file__).resolve().parent.parent


def targets(q, doc, lasso: dict | None, keepset: dict | None, variant: str, threshold: float) -> list[int] | None:
    """The target units of one question (document unit indices) for ``variant``; None: the
    question has no labels of that kind."""
    from masklab.lab.labels import keepset_target
    from masklab.lab.realdocs import answering_units
    from masklab.lab.train_ctx import targets as label_targets

    marks = {u for g in answering_units(doc, q.spans()) for u in g}
    ks = {keepset["window"][i] for i in keepset_target(keepset, KEEPSET_GAIN)} if keepset else None
    if variant == "marks":
        return sorted(marks)
    if variant == "union":
        return sorted(marks | (ks or set()))
    if variant == "keepset":
        return None if ks is None else sorted(ks)
    return None if lasso is None else label_targets(lasso, None, variant, threshold)  # lasso, attention


def material(model: str, tok):
    """The corpus's train questions, the val questions, their documents cut by ``tok``, and the
    random-ablation and keep-set label rows by question id (rows of a question since reworded left out)."""
    from masklab.lab.labels import question_key
    from masklab.lab.tasks import realdocs
    from masklab.text.document import segment
    from masklab.util.files import read_jsonl

    labels = ROOT / "results" / "corpus-labels"
    train = realdocs.load("train", realdocs.CORPUS)
    keys = {question_key(q): q.id for q in train}  # a row labels the question's present wording only
    lasso = {
        keys[r["key"]]: r
        for f in sorted(labels.glob(f"labels-{model}-train*.jsonl"))
        for r in read_jsonl(f)
        if r["key"] in keys
    }
    keepset = {
        keys[r["key"]]: r
        for f in sorted(labels.glob(f"labels-keepset-{model}-train*.jsonl"))
        for r in read_jsonl(f)
        if r["key"] in keys
    }
    val = realdocs.load("val", realdocs.CORPUS) + realdocs.load("val")
    docs: dict = {}
    for q in train + val:
        if q.doc not in docs:
            docs[q.doc] = segment(q.text, tok)
    return train, val, docs, lasso, keepset


def measure(path: Path, val: list, docs: dict, tok, hops: tuple[int, ...] = (1, 2)) -> dict:
    """Val figures of the trained file with each count of ``hops`` (each question's scores kept)."""
    from masklab.lab.routers import load_any
    from masklab.lab.train_pruner import keep_auto, val_figures
    from masklab.text.document import Document

    out = {}
    for h in hops:
        router = load_any("cross", path=path)
        router.hops = h
        t0, c0 = time.perf_counter(), time.process_time()
        fig = val_figures(lambda q, units: router.read_hops(Document(units=units), [q]).values[0], val, docs, tok)
        fig["keep_auto"] = keep_auto(fig["rows"], fig["kept@25"])
        fig.update(val_wall_s=time.perf_counter() - t0, val_cpu_s=time.process_time() - c0)
        out[f"hops{h}"] = fig
    return out


def summary(res: dict) -> list[dict]:
    """One row per measured variant and hop count (the generated tables' rows)."""
    return [
        {
            "task": "val",
            "method": f"{name}-hops{h}",
            "n": f["n"],
            "mrr": f["mrr"],
            "kept@10": f["kept@10"],
            "kept@25": f["kept@25"],
            "questions": v["questions"],
            "train_s": v["train_wall_s"],
        }
        for name, v in res["variants"].items()
        for h in (1, 2)
        if (f := v.get(f"hops{h}"))
    ]


def calibrated(rows: list[dict], threshold: float) -> dict:
    """Platt scaling fitted on val ``rows`` (each unit's score, and whether it is a marked unit) and
    the keep-auto ``threshold`` carried over to the calibrated scores (the scaling is monotone)."""
    import math

    from masklab.lab.stats import platt

    gold = [{u for g in r["gold"] for u in g} for r in rows]
    a, b = platt(
        [x for r in rows for x in r["scores"]], [i in g for r, g in zip(rows, gold) for i in range(len(r["scores"]))]
    )
    t = min(max(threshold, 1e-6), 1 - 1e-6)
    return {"platt": [a, b], "keep_auto": 1 / (1 + math.exp(-(a * math.log(t / (1 - t)) + b)))}


def store(path: Path, res: dict) -> None:
    """Write ``res`` to ``path``, keeping the variants another run stored there meanwhile."""
    from masklab.util.files import write_json

    if path.is_file():
        res["variants"] = {**json.loads(path.read_text())["variants"], **res["variants"]}
    for v in res["variants"].values():  # each question's scores to 5 decimals: a smaller file, the same ranks
        for fig in (f for h, f in v.items() if h.startswith("hops")):
            for r in fig.get("rows", []):
                r["scores"] = [round(x, 5) for x in r["scores"]]
    write_json(path, {**res, "summary": summary(res)})


def main() -> int:
    from masklab.lab import cross
    from masklab.lab.revision import code_hash
    from masklab.lab.train_pruner import shipped_recipe
    from masklab.pretrained.models import load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default="smollm2-135m", help="the model whose labels train (and whose tokenizer cuts units)"
    )
    ap.add_argument("--labels", default="marks", help="comma-separated variants: " + ", ".join(VARIANTS))
    ap.add_argument("--epochs", type=int, default=cross.CrossConfig.epochs, help="training epochs")
    ap.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="stop cleanly after this many minutes of training (the same command resumes from the last checkpoint)",
    )
    ap.add_argument(
        "--common",
        action="store_true",
        help="train every variant on the same questions: those that "
        "have labels of every variant listed (the controlled comparison; stored as VARIANT-common)",
    )
    ap.add_argument("--hops", default="1,2", help="the hop counts measured on val (comma-separated; --ship needs 1,2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument(
        "--ship",
        default=None,
        metavar="VARIANT",
        help="copy this variant, calibrated, to results/cross/shipped.safetensors (the lab router's file)",
    )
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    variants = a.labels.split(",")
    hops = tuple(int(h) for h in a.hops.split(","))
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown label variant {v!r}; choose from {', '.join(VARIANTS)}")
    tok = load(a.model, threads=a.threads).tokenizer
    train, val, docs, lasso, keepset = material(a.model, tok)
    threshold = shipped_recipe()["threshold"]
    out_dir = ROOT / "results" / "cross"
    res_path = out_dir / "results.json"
    res = json.loads(res_path.read_text()) if res_path.is_file() else {}
    res = {
        "variants": res.get("variants", {}),  # earlier variants (the LoRA design's) stay as measured
        "command": "python scripts/train_cross.py " + " ".join(sys.argv[1:]),
        "model": a.model,
        "keepset_gain": KEEPSET_GAIN,
        "val_questions": len(val),
    }
    cfg = cross.CrossConfig(epochs=a.epochs)
    deadline = None if a.minutes is None else time.perf_counter() + a.minutes * 60
    per = {
        v: {
            q.id: t
            for q in train
            if (t := targets(q, docs[q.doc], lasso.get(q.id), keepset.get(q.id), v, threshold)) is not None
        }
        for v in variants
    }
    common = set.intersection(*(set(t) for t in per.values())) if a.common else None
    for v in variants:
        examples = [
            cross.Example(q.question, docs[q.doc].units, per[v][q.id])
            for q in train
            if q.id in per[v] and (common is None or q.id in common)
        ]
        if a.common:
            v = f"{v}-common"
        data = hashlib.sha256(json.dumps([[e.question, e.target] for e in examples]).encode()).hexdigest()[:12]
        stamp = {
            "code": code_hash("masklab.lab.cross"),
            "config": cfg.__dict__,
            "questions": len(examples),
            "data": data,
        }
        done = res["variants"].get(v)
        if done and done.get("stamp") == stamp and (out_dir / f"{v}.safetensors").is_file():
            print(f"{v}: measured already", file=sys.stderr)
            continue
        print(f"{v}: {len(examples)} training questions; val: {len(val)}", file=sys.stderr)
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        t0, c0 = time.perf_counter(), time.process_time()
        ckpt = ROOT / "runs" / "cross" / f"ckpt-{v}-{len(examples)}-{data}"
        model, rec = cross.train(examples, cfg, ckpt, a.progress, left)
        if not rec["done"]:
            print(
                f"{v}: stopped after step {rec['steps']} (epoch {rec['epoch'] + 1}, step {rec['batch']}); the same "
                "command continues from there",
                file=sys.stderr,
            )
            return 0
        cross.save(model, out_dir / f"{v}.safetensors", {"labels": v, "model": a.model, "train": rec})
        row = {
            "stamp": stamp,
            "questions": len(examples),
            "train": rec,
            "train_wall_s": rec["seconds"],
            "this_run_cpu_s": time.process_time() - c0,
            "this_run_wall_s": time.perf_counter() - t0,
            "targets_per_question": sum(len(e.target) for e in examples) / len(examples),
        }
        row.update(measure(out_dir / f"{v}.safetensors", val, docs, tok, hops))
        res["variants"][v] = row
        store(res_path, res)
        print(
            v,
            {
                h: {k: round(f[k], 3) for k in ("mrr", "kept@10", "kept@25")}
                for h, f in row.items()
                if h.startswith("hops")
            },
            file=sys.stderr,
        )
    store(res_path, res)
    if a.ship:
        fig = res["variants"].get(a.ship, {})
        if not all(f"hops{h}" in fig for h in (1, 2)):
            raise SystemExit(
                f"--ship {a.ship}: that variant has no val figures with one hop and with two "
                "(train and measure it with --hops 1,2 first)"
            )
        hops = 2 if fig["hops2"]["kept@25"] > fig["hops1"]["kept@25"] else 1  # the hops chosen on val
        dest = out_dir / "shipped.safetensors"
        shutil.copyfile(out_dir / f"{a.ship}.safetensors", dest)
        meta = json.loads((out_dir / f"{a.ship}.json").read_text())
        meta.update(calibrated(fig[f"hops{hops}"]["rows"], fig[f"hops{hops}"]["keep_auto"]["threshold"]))
        meta.update(
            {
                "hops": hops,
                "val": {k: fig[f"hops{hops}"][k] for k in ("n", "mrr", "kept@10", "kept@25")},
                "command": res["command"],
            }
        )
        dest.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
