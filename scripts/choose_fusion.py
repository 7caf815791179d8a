"""Choose how ``bm25+evidence`` and ``bm25+dense`` combine BM25 with a second router, on val only.

Reads the val rows of ``masklab realdocs`` for both packaged models
(``results/realdocs-MODEL/results_val.json``: every router's per-unit scores), recomputes
every candidate fusion of :data:`masklab.lab.realdocs.CANDIDATES` from the stored
BM25 and second router's scores (no model runs), and applies the rule fixed before the val
results were read (:func:`masklab.lab.realdocs.choose`: for ``bm25+dense`` the fusion
must keep the answer at keep 0.1 no less often than ``bm25`` and ``dense`` alone). Writes
``results/realdocs-fusion/results.json`` (one summary row per candidate; the chosen one
marked) and prints the table. The same grid for the attention router is the control.

    python scripts/choose_fusion.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from masklab.lab.realdocs import choose, fusion_grid
from masklab.util.files import write_json

MODELS = ("smollm2-135m", "gemma3-270m")


def main() -> int:
    root = Path(__file__).resolve().parent.parent / "results"
    runs = {}
    for m in MODELS:
        res = json.loads((root / f"realdocs-{m}" / "results_val.json").read_text())
        if res["split"] != "val":
            sys.exit(f"{m}: not a val run")
        runs[m] = res["rows"]
    summary = []
    for other, floor in (("evidence", ("bm25",)), ("attention", ("bm25",)), ("dense", ("bm25", "dense"))):
        if other not in runs[MODELS[0]][0]:
            continue  # val rows made before this router
        grid = fusion_grid(runs, other=other, keep=0.1)
        best = choose(grid, floor)
        for g in grid:
            name = g["how"] if g["how"] in ("bm25", other) else f"{g['how']} {g['weight']:g}"
            summary.append(
                {
                    "task": f"val-bm25-{other}",
                    "method": name,
                    "n": sum(len(r) for r in runs.values()),
                    "chosen": g is best,
                    **{k: v for k, v in g.items() if k not in ("how", "weight")},
                    "how": g["how"],
                    "weight": g["weight"],
                }
            )
    out = {
        "command": "python scripts/choose_fusion.py",
        "rule": choose.__doc__.split("\n\n")[0].replace("\n", " "),
        "keep": 0.1,
        "models": list(MODELS),
        "summary": summary,
    }
    write_json(root / "realdocs-fusion" / "results.json", out)
    for s in summary:
        print(
            f"{s['task']:28s} {s['method']:12s} mrr {s['mrr']:.3f} kept@10 {s['kept']:.3f}"
            + "".join(f"  {m}: {s['mrr_' + m]:.3f}/{s['kept_' + m]:.2f}" for m in MODELS)
            + ("  <- chosen" if s["chosen"] else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
