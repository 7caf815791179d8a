"""Causal keep-set labels against the writers' marks and the attention control, the cross pruner
trained on each over the same questions: paired tests on val and test3, from stored rows.

    python scripts/label_comparison.py [--out results/realdocs-cross-labels-smollm2-135m/label_comparison.json]

Val: the ``VARIANT-common`` rows ``scripts/train_cross.py --common`` stored in
``results/cross/results.json`` (each question's scores, one hop; kept@0.25 recomputed as
:func:`masklab.lab.train_pruner.val_figures` computes it), and the ``union`` variant (every training
question) against the shipped ``cross`` with one hop and ``pruner-ctx``, on the corpus val questions
``masklab realdocs --split corpus-val`` read (``val-union``, paired against the shipped cross).
Test3: the rows of ``masklab realdocs --split test3
--routers cross-marks-common,cross-keepset-common,cross-attention-common``
(``results/realdocs-cross-labels-smollm2-135m/results_test3.json``). For each split, every
question and the multi-unit ones: MRR, all evidence kept at 0.25 of the tokens with its Wilson
interval, and each variant against ``keepset`` (sign-flip test on the reciprocal ranks, McNemar
on kept@0.25).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAL = ROOT / "results" / "cross" / "results.json"
CORPUS_VAL = ROOT / "results" / "realdocs-cross-smollm2-135m" / "results_corpus-val.json"
TEST3 = ROOT / "results" / "realdocs-cross-labels-smollm2-135m" / "results_test3.json"
COMMON = ("keepset", "marks", "attention")


def val_outcomes(res: dict, variant: str) -> dict[str, tuple[float, bool]]:
    """``id -> (reciprocal rank, all evidence kept at 0.25)`` of one variant's one-hop val rows."""
    import torch

    from masklab.lab.realdocs import rank_of
    from masklab.text.selection import select

    out = {}
    for r in res["variants"][variant]["hops1"]["rows"]:
        s = torch.tensor(r["scores"])
        kept = set(select(s, r["lengths"], 0.25, fill=True))
        out[r["id"]] = (1 / rank_of(s, r["gold"]), all(u in kept for g in r["gold"] for u in g))
    return out


def compare(
    named: dict[str, dict[str, tuple[float, bool]]], kinds: dict[str, str], split: str, against: str
) -> list[dict]:
    """Summary rows of each variant over ``split``'s questions (all, multi-unit), paired against ``against``."""
    from masklab.lab.realdocs import sign_flip_p
    from masklab.lab.stats import mcnemar, wilson
    from masklab.lab.tasks.realdocs import MULTI_UNIT

    ids = sorted(set.intersection(*(set(o) for o in named.values())))
    rows = []
    for group in ("all", "multi-unit"):
        sub = [i for i in ids if group == "all" or kinds.get(i) in MULTI_UNIT]
        for name, o in named.items():
            rr, kept = [o[i][0] for i in sub], [o[i][1] for i in sub]
            lo, hi = wilson(sum(kept), len(sub))
            row = {
                "task": f"{split}-{group}",
                "method": name,
                "n": len(sub),
                "mrr": sum(rr) / len(sub),
                "kept@25": sum(kept) / len(sub),
                "kept@25_lo": lo,
                "kept@25_hi": hi,
            }
            if name != against:
                base = named[against]
                row[f"p_mrr_vs_{against}"] = sign_flip_p(rr, [base[i][0] for i in sub])
                row[f"p_kept@25_vs_{against}"] = mcnemar(kept, [base[i][1] for i in sub])
            rows.append(row)
    return rows


def main() -> int:
    from masklab.lab.tasks import realdocs
    from masklab.util.files import write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=TEST3.parent / "label_comparison.json", help="output file")
    a = ap.parse_args()
    questions = realdocs.load("val", realdocs.CORPUS) + realdocs.load("val") + realdocs.load("test3")
    kinds = {q.id: q.kind for q in questions}
    res = json.loads(VAL.read_text())
    summary = compare({v: val_outcomes(res, f"{v}-common") for v in COMMON}, kinds, "val", "keepset")
    sources = {"val": str(VAL.relative_to(ROOT))}
    if "union" in res["variants"]:  # against the shipped cross (one hop) and pruner-ctx on the questions both read
        rows = json.loads(CORPUS_VAL.read_text())["rows"]
        named = {
            "union": val_outcomes(res, "union"),
            **{
                name: {r["id"]: (r[name]["rr"], r[name]["0.25"]["kept"]) for r in rows}
                for name in ("cross-hop1", "pruner-ctx")
            },
        }
        summary += compare(named, kinds, "val-union", "cross-hop1")
        sources["val-union"] = str(CORPUS_VAL.relative_to(ROOT))
    if TEST3.is_file():
        rows = json.loads(TEST3.read_text())["rows"]
        named = {
            v: {r["id"]: (r[f"cross-{v}-common"]["rr"], r[f"cross-{v}-common"]["0.25"]["kept"]) for r in rows}
            for v in COMMON
        }
        summary += compare(named, kinds, "test3", "keepset")
        sources["test3"] = str(TEST3.relative_to(ROOT))
    write_json(a.out, {"command": "python scripts/label_comparison.py", "sources": sources, "summary": summary})
    for s in summary:
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
