"""How often the causal and the attention labels of the corpus agree with the writers' marks.

    python scripts/label_agreement.py [--model smollm2-135m] [--split train] [--threshold 1]

Over the labelled questions of ``results/corpus-labels/labels-MODEL-SPLIT*.jsonl`` whose marked
answering unit lies in the labelled window: the share whose top unit (highest causal weight; most
attended) is a marked one, and the share whose causal set (weight above ``--threshold`` nats; for
attention as many units, the most attended) contains a marked one, with Wilson intervals and a
McNemar test of causal against attention on the same questions. Writes
``results/corpus-labels/agreement.json`` (SmolLM2's train labels) or ``agreement-MODEL-SPLIT.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    from masklab.lab.train_pruner import target_set
    from masklab.util.files import write_json
    from masklab.lab.stats import mcnemar, wilson

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="whose labels")
    ap.add_argument("--split", default="train", choices=["train", "val"], help="the corpus split's labels")
    ap.add_argument("--threshold", type=float, default=1.0, help="the causal set's floor in nats")
    a = ap.parse_args()
    files = sorted((ROOT / "results" / "corpus-labels").glob(f"labels-{a.model}-{a.split}*.jsonl"))
    labelled = list({r["key"]: r for f in files for r in map(json.loads, f.open())}.values())
    rows = [r for r in labelled if any(m in r["window"] for m in r["marked"])]
    marked = [{r["window"].index(m) for m in r["marked"] if m in r["window"]} for r in rows]
    hits = {
        "causal_top": [max(range(len(r["weights"])), key=r["weights"].__getitem__) in m for r, m in zip(rows, marked)],
        "attention_top": [
            max(range(len(r["attention"])), key=r["attention"].__getitem__) in m for r, m in zip(rows, marked)
        ],
        "causal_set": [bool(set(target_set(r, "causal", a.threshold)) & m) for r, m in zip(rows, marked)],
        "attention_set": [bool(set(target_set(r, "attention", a.threshold)) & m) for r, m in zip(rows, marked)],
    }
    n = len(rows)
    summary = []
    for name, h in hits.items():
        lo, hi = wilson(sum(h), n)
        summary.append(
            {"task": "agreement", "method": name, "n": n, "share": sum(h) / n, "share_lo": lo, "share_hi": hi}
        )
    for what in ("top", "set"):
        summary.append(
            {
                "task": "agreement",
                "method": f"causal-vs-attention-{what}",
                "n": n,
                "p": mcnemar(hits[f"causal_{what}"], hits[f"attention_{what}"]),
            }
        )
    sizes = [len(target_set(r, "causal", a.threshold)) for r in rows]
    out = {
        "command": "python scripts/label_agreement.py " + " ".join(sys.argv[1:]),
        "model": a.model,
        "split": a.split,
        "threshold": a.threshold,
        "labelled": len(labelled),
        "marked_in_window": len(rows),
        "mean_causal_set": sum(sizes) / n,
        "empty_causal_set": sum(s == 0 for s in sizes) / n,
        "seconds_per_question": sum(r["seconds"] for r in rows) / n,
        "passes_per_question": sum(r["passes"] for r in rows) / n,
        "summary": summary,
    }
    name = (
        "agreement.json" if (a.model, a.split) == ("smollm2-135m", "train") else f"agreement-{a.model}-{a.split}.json"
    )
    write_json(ROOT / "results" / "corpus-labels" / name, out)
    for s in summary:
        print(s)
    print({k: v for k, v in out.items() if k != "summary"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
