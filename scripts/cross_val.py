"""The cross pruner (the lab's ``cross`` router, its two faults fixed) against the default ``pruner-ctx`` on
the corpus's val questions: the verdict that decides whether it stays in the product.

    python scripts/cross_val.py [--file results/cross/shipped.safetensors] [--out results/cross/val.json]
                                [--questions 320] [--threads 1]

The corpus's val questions (``masklab realdocs --split corpus-val``'s, taken in turn from each
document; ``--questions N``: the first N of them, as ``masklab realdocs --questions`` takes them),
each router read as ``masklab realdocs`` reads it (:func:`masklab.lab.realdocs.evaluate_question`: its
second hop, the writers' marks as the truth) and summarised as it summarises
(:func:`masklab.lab.realdocs.summarise`: MRR, all evidence kept at 0.1 and 0.25 of the tokens with
Wilson intervals), with the paired tests against ``pruner-ctx`` (sign-flip on the reciprocal ranks,
McNemar on each kept). ``--file``: the cross pruner file (``scripts/train_cross.py --ship`` writes
``results/cross/shipped.safetensors``; the file packaged until 2026-12-07: ``git show
9972872:masklab/context/weights/cross/cross.safetensors`` and its ``cross.json``). Each question's row
is appended to ``runs/cross-val/rows.jsonl`` as it is read (a killed run resumes), and the results
file is rewritten every 50 questions with the rows so far. Val only: no test split is read.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "pruner-ctx"


def paired(summary: list[dict], rows: list[dict], name: str, keeps: list[float]) -> None:
    """Add to ``name``'s summary rows the paired tests against :data:`BASELINE` on the same questions."""
    from masklab.lab.realdocs import pct, sign_flip_p
    from masklab.lab.stats import mcnemar
    from masklab.lab.tasks.realdocs import KINDS, MULTI_UNIT

    groups = {
        "all": rows,
        "two+latest": [r for r in rows if r["kind"] != "single"],
        "multi-unit": [r for r in rows if r["kind"] in MULTI_UNIT],
        **{k: [r for r in rows if r["kind"] == k] for k in KINDS},
    }
    for s in summary:
        if s["method"] != name or not groups.get(s["task"]):
            continue
        cell = groups[s["task"]]
        s[f"p_mrr_vs_{BASELINE}"] = sign_flip_p([r[name]["rr"] for r in cell], [r[BASELINE]["rr"] for r in cell])
        for k in keeps:
            s[f"p_kept@{pct(k)}_vs_{BASELINE}"] = mcnemar(
                [r[name][str(k)]["kept"] for r in cell], [r[BASELINE][str(k)]["kept"] for r in cell]
            )


def main() -> int:
    import torch

    from masklab.lab.realdocs import evaluate_question, in_turn, summarise
    from masklab.lab.routers import load_any
    from masklab.lab.tasks import realdocs
    from masklab.pretrained.models import load
    from masklab.util.files import append_jsonl, read_jsonl, write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=ROOT / "results" / "cross" / "shipped.safetensors")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "cross" / "val.json")
    ap.add_argument("--model", default="smollm2-135m", help="the model whose tokenizer cuts units and counts tokens")
    ap.add_argument("--questions", type=int, default=0, help="the first N questions taken in turn (0: every one)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    a = ap.parse_args()
    from masklab.lab.revision import code_hash

    torch.set_num_threads(a.threads)
    keeps = [0.1, 0.25]
    questions = in_turn(realdocs.load("corpus-val"))[: a.questions or None]
    lm = load(a.model, threads=a.threads)
    routers = {BASELINE: load_any(BASELINE, lm), "cross": load_any("cross", lm, path=a.file)}
    stamp = {
        "benchmark": realdocs.benchmark_digest("corpus-val"),
        "cross_file": hashlib.sha256(a.file.read_bytes()).hexdigest()[:12],
        "cross_hops": routers["cross"].hops,
        "model": lm.name,
        "code": code_hash("masklab.lab.routers.cross"),
    }
    log = ROOT / "runs" / "cross-val" / "rows.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    done = {r["id"]: r for r in read_jsonl(log) if r.get("stamp") == stamp} if log.is_file() else {}
    docs: dict = {}

    def write() -> None:
        rows = [done[q.id] for q in questions if q.id in done]
        summary = summarise(rows, list(routers), keeps)
        paired(summary, rows, "cross", keeps)
        write_json(
            a.out,
            {
                "command": "python scripts/cross_val.py " + " ".join(sys.argv[1:]),
                "split": "corpus-val",
                "stamp": stamp,
                "questions": {"n": len(rows), "of": len(questions), "documents": len({r["doc"] for r in rows})},
                "router_seconds": {n: sum(r[n]["router_seconds"] for r in rows) for n in routers},
                "machine": "a shared 2-core CPU (about nine jobs beside), one torch thread: seconds are not timings",
                "summary": summary,
                "rows": rows,
            },
        )

    for k, q in enumerate(questions):
        if q.id in done:
            continue
        row = evaluate_question(lm, q, routers, keeps, False, 24, docs)
        row["stamp"] = stamp
        append_jsonl(log, row)
        done[q.id] = row
        if k % 50 == 49:
            write()
            print(f"{len(done)}/{len(questions)} questions", file=sys.stderr)
    write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
