"""``--keep auto`` against fixed keeps, recomputed from stored ``masklab realdocs`` rows (no model runs).

    python scripts/keep_auto.py [--out FILE] results/realdocs-pruner-smollm2-135m/results_test2.json [...]

For each results file and each pruner router in it (``pruner``, ``pruner-attention``,
``pruner-marks``, ``pruner-ctx``, ``pruner-ctx-attention``): every unit whose stored score the
router's ``keep_auto`` value keeps by its ``keep_rule`` (a score, or a share of the best unit's score;
both from its shipped ``.json``, chosen on val; the top unit and its ``context`` neighbours always) is
kept, as ``Router.resolve_keep`` does. Per question: every answering unit kept or not, and the kept fraction of
the tokens; summed
with Wilson intervals, beside the same router at the file's fixed keeps, with a McNemar test of
auto against keep 0.25, and a fixed keep of auto's mean kept fraction (``kept@same``: the same mean
tokens). And for every router in the file, the selection with the best unit's neighbours (``context``
1: the unit on each side of the best one kept right after it) against without (``context`` 0), at
keep 0.1 and 0.25 (McNemar at 0.1): rows of task ``context-SPLIT-MODEL``. Writes
``results/pruner/keep_auto.json`` (or ``--out``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
ROUTERS = {
    "pruner": "causal",
    "pruner-attention": "attention",
    "pruner-marks": "marks",
    "pruner-ctx": "ctx-union",
    "pruner-ctx-attention": "ctx-attention",
}  # router -> its shipped weights' name


def main() -> int:
    from masklab.util.files import write_json
    from masklab.text.selection import auto_fraction, select
    from masklab.lab.stats import mcnemar, wilson

    args = sys.argv[1:]
    out = ROOT / "results" / "pruner" / "keep_auto.json"
    if args[:1] == ["--out"]:
        out, args = Path(args[1]), args[2:]
    summary = []
    for f in args:
        res = json.loads(Path(f).read_text())
        for name in ROUTERS:
            if name not in res["rows"][0]:
                continue
            meta = json.loads(
                (ROOT / "masklab" / "context" / "weights" / "pruner" / f"{ROUTERS[name]}.json").read_text()
            )
            rule, context = meta.get("keep_rule", "threshold"), meta.get("context", 0)
            kept, frac = [], []
            for r in res["rows"]:
                s = torch.tensor(r[name]["scores"])
                k = set(
                    select(
                        s,
                        r["lengths"],
                        auto_fraction(s, r["lengths"], meta["keep_auto"], rule, context),
                        context=context,
                    )
                )
                kept.append(all(u in k for g in r["gold"] for u in g))
                frac.append(sum(r["lengths"][i] for i in k) / sum(r["lengths"]))
            n = len(kept)
            lo, hi = wilson(sum(kept), n)
            fixed = [r[name]["0.25"]["kept"] for r in res["rows"]]
            same = [
                all(
                    u
                    in set(
                        select(torch.tensor(r[name]["scores"]), r["lengths"], sum(frac) / len(frac), context=context)
                    )
                    for g in r["gold"]
                    for u in g
                )
                for r in res["rows"]
            ]
            summary.append(
                {
                    "task": f"{res['split']}-{res['model']}",
                    "method": name,
                    "n": n,
                    "threshold": meta["keep_auto"],
                    "rule": rule,
                    "kept@auto": sum(kept) / n,
                    "kept@auto_lo": lo,
                    "kept@auto_hi": hi,
                    "fraction@auto": sum(frac) / n,
                    "kept@25": sum(fixed) / n,
                    "fraction@25": sum(r[name]["0.25"]["kept_fraction"] for r in res["rows"]) / n,
                    "p_auto_vs_25": mcnemar(kept, fixed),
                    "kept@same": sum(same) / n,
                    "p_auto_vs_same": mcnemar(kept, same),
                }
            )
            print(summary[-1])
        summary += context_rows(res)
    write_json(out, {"command": "python scripts/keep_auto.py " + " ".join(sys.argv[1:]), "summary": summary})
    return 0


def context_rows(res: dict) -> list[dict]:
    """kept@0.1 and @0.25 of every router of a results file with 0 and 1 units beside the best one kept."""
    from masklab.lab.stats import mcnemar
    from masklab.text.selection import select

    out = []
    for name in [k for k, v in res["rows"][0].items() if isinstance(v, dict) and "scores" in v]:
        row = {"task": f"context-{res['split']}-{res['model']}", "method": name, "n": len(res["rows"])}
        kept = {}
        for keep in (0.1, 0.25):
            for context in (0, 1):
                kept[keep, context] = [
                    all(
                        u in set(select(torch.tensor(r[name]["scores"]), r["lengths"], keep, context=context))
                        for g in r["gold"]
                        for u in g
                    )
                    for r in res["rows"]
                ]
                row[f"kept@{round(keep * 100)}_context{context}"] = sum(kept[keep, context]) / row["n"]
        row["p_kept@10_context1_vs_0"] = mcnemar(kept[0.1, 1], kept[0.1, 0])
        out.append(row)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
