"""How well the keep-set labels and the round-5 random-ablation labels agree with the writers' marks,
by question kind, on the same questions.

    python scripts/keepset_agreement.py [--model smollm2-135m] [--split val]

Over the questions labelled both ways (``results/corpus-labels/labels-MODEL-SPLIT*.jsonl`` and
``labels-keepset-MODEL-SPLIT.jsonl``) whose marked answering units lie in the labelled window: the share
whose target set holds every marked unit (``all``), holds one (``any``), and the mean share of the set that
is marked (``precision``), for the ``lasso`` set (weight above the shipped pruner's threshold), the
``keepset`` set (:func:`masklab.lab.labels.keepset_target`) and their ``union``, with Wilson intervals
and McNemar tests of keepset and union against lasso on ``all``; and the same figures for every keep-set
row alone (``keepset-rows-KIND``: the kinds no random-ablation labels cover too), each labelled
wording once. Writes
``results/corpus-labels/keepset-agreement-MODEL-SPLIT.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tally(h: dict, marked: set[int], target: set[int]) -> None:
    """Add one question to ``h``: whether ``target`` holds every ``marked`` unit, one of them, the
    share of it that is marked, and its size."""
    for key, value in (
        ("all", marked <= target),
        ("any", bool(marked & target)),
        ("precision", len(marked & target) / len(target) if target else 0.0),
        ("size", len(target)),
    ):
        h.setdefault(key, []).append(value)


def figures(task: str, method: str, h: dict) -> dict:
    """One summary row of a :func:`tally`: the shares and means, with a Wilson interval on ``all``."""
    from masklab.lab.stats import wilson

    n = len(h["all"])
    lo, hi = wilson(sum(h["all"]), n)
    return {
        "task": task,
        "method": method,
        "n": n,
        "all": sum(h["all"]) / n,
        "all_lo": lo,
        "all_hi": hi,
        "any": sum(h["any"]) / n,
        "precision": sum(h["precision"]) / n,
        "size": sum(h["size"]) / n,
    }


def main() -> int:
    from masklab.lab.train_pruner import shipped_recipe
    from masklab.util.files import read_jsonl, write_json
    from masklab.lab.stats import mcnemar
    from masklab.lab.labels import keepset_target
    from masklab.lab.tasks.realdocs import MULTI_UNIT
    from masklab.lab.train_ctx import KEEPSET_GAIN, targets

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="whose labels")
    ap.add_argument("--split", default="val", choices=["train", "val"], help="the corpus split's labels")
    a = ap.parse_args()
    folder = ROOT / "results" / "corpus-labels"
    lasso = {r["id"]: r for f in sorted(folder.glob(f"labels-{a.model}-{a.split}*.jsonl")) for r in read_jsonl(f)}
    keepset_rows = [r for f in sorted(folder.glob(f"labels-keepset-{a.model}-{a.split}*.jsonl")) for r in read_jsonl(f)]
    keepset = {r["id"]: r for r in keepset_rows}
    th = shipped_recipe()["threshold"]
    ids = [i for i in keepset if i in lasso and any(m in lasso[i]["window"] for m in lasso[i]["marked"])]
    hits: dict = {}
    for i in ids:
        r = lasso[i]
        marked = {m for m in r["marked"] if m in r["window"]}
        for variant in ("lasso", "keepset", "union"):
            t = set(targets(r, keepset[i], variant, th))
            for kind in ("all", r["kind"]):
                tally(hits.setdefault(kind, {}).setdefault(variant, {}), marked, t)
    summary = []
    for kind, by in hits.items():
        for variant, h in by.items():
            summary.append(figures(kind, variant, h))
        for variant in ("keepset", "union"):
            summary.append(
                {
                    "task": kind,
                    "method": f"{variant}-vs-lasso",
                    "n": len(by["lasso"]["all"]),
                    "p": mcnemar(by[variant]["all"], by["lasso"]["all"]),
                }
            )
    # every keep-set row alone (the kinds that have no random-ablation labels: bridge, comparison, multi)
    alone: dict = {}
    for r in {r["key"]: r for r in keepset_rows}.values():
        marked = {m for m in r["marked"] if m in r["window"]}
        if not marked:
            continue
        t = {r["window"][i] for i in keepset_target(r, KEEPSET_GAIN)}  # window places to the document's units
        for kind in dict.fromkeys(("all", "multi-unit" if r["kind"] in MULTI_UNIT else "one-unit", r["kind"])):
            tally(alone.setdefault(kind, {}), marked, t)
    summary += [figures(f"keepset-rows-{kind}", "keepset", h) for kind, h in alone.items()]
    rows = [keepset[i] for i in ids]
    out = {
        "command": "python scripts/keepset_agreement.py " + " ".join(sys.argv[1:]),
        "model": a.model,
        "split": a.split,
        "lasso_threshold": th,
        "keepset_gain": KEEPSET_GAIN,
        "questions": len(ids),
        "seconds_per_question": sum(r["seconds"] for r in rows) / max(1, len(rows)),
        "passes_per_question": sum(r["passes"] for r in rows) / max(1, len(rows)),
        "summary": summary,
    }
    write_json(folder / f"keepset-agreement-{a.model}-{a.split}.json", out)
    for s in summary:
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
