"""Train the context-aware pruner's label variants on the corpus labels and measure them on val only.

    python scripts/train_cross.py [--model smollm2-135m] [--labels lasso,union,attention,marks] [--epochs 2] [--ship union]

Reads the round-5 random-ablation labels (``results/corpus-labels/labels-MODEL-train*.jsonl``) and the
keep-set labels (``labels-keepset-MODEL-train.jsonl``, :func:`masklab.lab.labels.keepset_label`), and
trains one :class:`masklab.lab.cross.CrossPruner` per label variant, everything else equal (the
same questions, windows, encoder, steps and seed):

* ``lasso``: the units whose random-ablation weight is above the shipped pruner's threshold (round 5);
* ``keepset``: the units :func:`~masklab.lab.labels.keepset_target` credits, where a question has
  keep-set labels (the others keep their ``lasso`` set);
* ``union``: both sets together;
* ``attention``: as many units as the ``lasso`` set has, the most attended (the control);
* ``marks``: the units the writers marked as answering.

Each variant checkpoints after every epoch in ``results/cross/ckpt-VARIANT/`` (a killed run resumes) and
is stored in ``results/cross/VARIANT.safetensors``. Val (never trained on): the corpus's ``val``
documents and the benchmark's ``val`` split, the writers' marks as the truth (the figures of
``scripts/train_pruner.py``: MRR, kept@0.1, kept@0.25, each question's scores); written to
``results/cross/results.json`` with the wall and CPU seconds of each step. ``--ship VARIANT`` copies
that variant, with its val figures and ``keep_auto`` threshold, to
``masklab/context/weights/pruner/cross.safetensors`` (+ ``.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
VARIANTS = ("lasso", "keepset", "union", "attention", "marks")
KEEPSET_GAIN = 1.0  # nats over reading nothing for a keep set to credit its units


def targets(lasso: dict, keepset: dict | None, variant: str, threshold: float) -> list[int]:
    """The target units of one question (document unit indices) for ``variant``."""
    from masklab.lab.labels import keepset_target
    from masklab.lab.train_pruner import target_set

    win = lasso["window"]
    causal = {win[i] for i in target_set(lasso, "causal", threshold)}
    if variant == "lasso":
        return sorted(causal)
    if variant == "attention":
        return sorted(win[i] for i in target_set(lasso, "attention", threshold))
    if variant == "marks":
        return sorted(lasso["marked"])
    ks = {keepset["window"][i] for i in keepset_target(keepset, KEEPSET_GAIN)} if keepset else None
    if variant == "keepset":
        return sorted(causal if ks is None else ks)
    if variant == "union":
        return sorted(causal | (ks or set()))
    raise SystemExit(f"unknown label variant {variant!r}; choose from {', '.join(VARIANTS)}")


def summary(res: dict) -> list[dict]:
    """One row per measured variant (the generated tables' rows)."""
    return [{"task": "val", "method": name, "n": f["n"], "mrr": f["mrr"], "kept@10": f["kept@10"], "kept@25": f["kept@25"],
             "targets": f["targets_per_question"], "train_s": f["train_wall_s"],
             **({"auto_threshold": f["keep_auto"]["threshold"], "auto_fraction": f["keep_auto"]["fraction"],
                 "auto_kept": f["keep_auto"]["kept"]} if f["keep_auto"] else {})}
            for name, f in res["variants"].items()]


def material(model: str, tok) -> tuple[dict, dict, dict, list, dict]:
    """The training labels (round-5 and keep-set rows by question id), the corpus questions by id,
    the val questions, and every one of their documents cut by ``tok``."""
    from masklab.lab.tasks import realdocs
    from masklab.text.document import segment
    from masklab.util.files import read_jsonl

    labels = ROOT / "results" / "corpus-labels"
    lasso = {r["id"]: r for f in sorted(labels.glob(f"labels-{model}-train*.jsonl")) for r in read_jsonl(f)}
    keepset = {r["id"]: r for f in sorted(labels.glob(f"labels-keepset-{model}-train*.jsonl")) for r in read_jsonl(f)}
    corpus = {q.id: q for q in realdocs.load("all", realdocs.CORPUS)}
    val = realdocs.load("val", realdocs.CORPUS) + realdocs.load("val")
    docs: dict = {}
    for q in list(corpus.values()) + val:
        if q.doc not in docs:
            docs[q.doc] = segment(q.text, tok)
    return lasso, keepset, corpus, val, docs


def main() -> int:
    from masklab.lab import cross
    from masklab.lab.train_pruner import shipped_recipe
    from masklab.util.files import write_json
    from masklab.pretrained.models import load
    from masklab.lab.revision import code_hash
    from train_pruner import keep_auto, val_figures

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="the model whose labels train (and whose tokenizer cuts units)")
    ap.add_argument("--labels", default="lasso,union,attention,marks", help="comma-separated variants: " + ", ".join(VARIANTS))
    ap.add_argument("--epochs", type=int, default=cross.CrossConfig.epochs, help="training epochs")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--ship", default=None, metavar="VARIANT", help="copy this variant into masklab/context/weights/pruner")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    variants = a.labels.split(",")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown label variant {v!r}; choose from {', '.join(VARIANTS)}")
    tok = load(a.model, threads=a.threads).tokenizer
    lasso, keepset, corpus, val, docs = material(a.model, tok)
    threshold = shipped_recipe()["threshold"]
    out_dir = ROOT / "results" / "cross"
    res_path = out_dir / "results.json"
    res = json.loads(res_path.read_text()) if res_path.is_file() else {"variants": {}}
    res.pop("summary", None)
    res.update({"command": "python scripts/train_cross.py " + " ".join(sys.argv[1:]), "model": a.model,
                "lasso_threshold": threshold, "keepset_gain": KEEPSET_GAIN, "val_questions": len(val)})
    print(f"{len(lasso)} labelled questions ({len(keepset)} with keep-set labels); val: {len(val)}", file=sys.stderr)
    cfg = cross.CrossConfig(epochs=a.epochs)
    for v in variants:
        examples = [cross.Example(corpus[i].question, docs[corpus[i].doc].units, targets(r, keepset.get(i), v, threshold))
                    for i, r in lasso.items()]
        stamp = {"code": code_hash("masklab.lab.cross"), "config": cfg.__dict__, "keepset_rows": len(keepset),
                 "questions": len(examples)}
        done = res["variants"].get(v)
        if done and done.get("stamp") == stamp and (out_dir / f"{v}.safetensors").is_file():
            print(f"{v}: measured already", file=sys.stderr)
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        model, rec = cross.train(examples, cfg, out_dir / f"ckpt-{v}-{stamp['keepset_rows']}", a.progress)
        train_s = (time.perf_counter() - t0, time.process_time() - c0)
        cross.save(model, out_dir / f"{v}.safetensors", {"labels": v, "model": a.model, "train": rec})
        model, _ = cross.load_cross(out_dir / f"{v}.safetensors")  # measured as it is used: adapters merged
        t0, c0 = time.perf_counter(), time.process_time()
        fig = val_figures(model.rank, val, docs, tok)
        fig["keep_auto"] = keep_auto(fig["rows"], fig["kept@25"])
        res["variants"][v] = {"stamp": stamp, "train": rec, "train_wall_s": train_s[0], "train_cpu_s": train_s[1],
                              "val_wall_s": time.perf_counter() - t0, "val_cpu_s": time.process_time() - c0,
                              "targets_per_question": sum(len(e.target) for e in examples) / len(examples), **fig}
        write_json(res_path, {**res, "summary": summary(res)})
        print(v, {k: round(fig[k], 3) for k in ("mrr", "kept@10", "kept@25")}, file=sys.stderr)
    write_json(res_path, {**res, "summary": summary(res)})
    if a.ship:
        fig = res["variants"][a.ship]
        dest = ROOT / "masklab" / "context" / "weights" / "pruner" / "cross.safetensors"
        shutil.copyfile(out_dir / f"{a.ship}.safetensors", dest)
        meta = json.loads((out_dir / f"{a.ship}.json").read_text())
        meta.update({"keep_auto": fig["keep_auto"] and fig["keep_auto"]["threshold"],
                     "val": {k: fig[k] for k in ("n", "mrr", "kept@10", "kept@25")}, "command": res["command"]})
        dest.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
