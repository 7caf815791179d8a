"""Do a router's keep probabilities mean what they say? Expected calibration error and a reliability
plot from the per-question scores ``masklab realdocs`` stores, and Platt scaling fitted on val.

    python scripts/calibration.py --val results/realdocs-X/results_corpus-val.json [--test RESULTS ...]
                                  [--routers pruner-ctx,cross] [--out results/calibration]

Every unit of every question is one point: its score (a probability for the routers that decide how
much to keep) and whether it is evidence (one of the writers' answering units). For each router: the
ECE before and after Platt scaling (``sigmoid(a * logit(p) + b)``, fitted on the val file only, then
applied unchanged to each ``--test`` file), one reliability plot per router
(``OUT/reliability-ROUTER.png``: val and test, before and after), and ``OUT/calibration.json``.
The ``cross`` router applies the fit its weights file carries (``platt``; ``scripts/train_cross.py
--ship`` fits it on val); ``pruner-ctx`` calibrates in its own head.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def points(res: dict, router: str) -> tuple[list[float], list[bool]]:
    """Every unit's score and whether it is evidence, over a results file's rows."""
    probs, labels = [], []
    for row in res["rows"]:
        gold = {u for g in row["gold"] for u in g}
        for i, s in enumerate(row[router]["scores"]):
            probs.append(min(1.0, max(0.0, s)))
            labels.append(i in gold)
    return probs, labels


def main() -> int:
    import math

    import matplotlib.pyplot as plt

    from masklab.lab.stats import platt, reliability
    from masklab.util.files import write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--val", type=Path, required=True, help="a results_*.json of masklab realdocs on a val split")
    ap.add_argument("--test", type=Path, nargs="*", default=[], help="results files the val fit is applied to")
    ap.add_argument("--routers", default="pruner-ctx", help="comma-separated routers with scores in [0, 1]")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "calibration", help="output folder")
    a = ap.parse_args()
    files = {
        "val": json.loads(a.val.read_text()),
        **{p.stem.split("_", 1)[-1]: json.loads(p.read_text()) for p in a.test},
    }
    a.out.mkdir(parents=True, exist_ok=True)
    out = {"val": str(a.val), "test": [str(p) for p in a.test], "routers": {}}
    for router in a.routers.split(","):
        fit = platt(*points(files["val"], router))
        rec = {"platt": fit, "splits": {}}
        fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
        for name, res in files.items():
            p, y = points(res, router)
            cal = [1 / (1 + math.exp(-(fit[0] * math.log(max(x, 1e-6) / max(1 - x, 1e-6)) + fit[1]))) for x in p]
            before, after = reliability(p, y), reliability(cal, y)
            rec["splits"][name] = {
                "units": len(p),
                "ece": before[0],
                "ece_calibrated": after[0],
                "bins": before[1],
                "bins_calibrated": after[1],
            }
            for ax, (ece, bins), title in zip(axes, (before, after), ("as scored", "Platt-scaled on val")):
                ax.plot(
                    [b["probability"] for b in bins],
                    [b["evidence"] for b in bins],
                    "o-",
                    label=f"{name} (ECE {ece:.3f})",
                )
                ax.set_title(f"{router}: {title}")
        for ax in axes:
            ax.plot([0, 1], [0, 1], "k:", lw=1)
            ax.set_xlabel("keep probability")
            ax.legend(fontsize=8)
        axes[0].set_ylabel("share of units that are evidence")
        fig.tight_layout()
        fig.savefig(a.out / f"reliability-{router}.png", dpi=110)
        plt.close(fig)
        out["routers"][router] = rec
        print(router, {n: (round(s["ece"], 3), round(s["ece_calibrated"], 3)) for n, s in rec["splits"].items()})
    write_json(a.out / "calibration.json", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
