"""What does ``--keep auto`` cost where the answer must almost always survive? Keep rules chosen on val,
measured on the test splits from the per-question scores ``masklab realdocs`` stored (no new read).

    python scripts/keep_rules.py [--target 0.95] [--routers pruner-ctx,cross] [--out results/keep-rules]

For each router and each keep rule of :data:`masklab.text.selection.KEEP_RULES` (a score threshold, or
a share of the best unit's score), every value its val scores suggest is tried on val
(``results/realdocs-cross-smollm2-135m/results_corpus-val.json``) through the product's own
:func:`~masklab.text.selection.auto_fraction` and :func:`~masklab.text.selection.select` (the router's
neighbours kept with the best unit, as ``--keep auto`` does); the rule kept is the one with the fewest
tokens among those that keep all of a question's evidence for at least ``--target`` of the val
questions. That rule, and the router's shipped ``keep_auto``, are then applied unchanged to the stored
scores of the second test split (``pruner-ctx`` only: ``results/realdocs-ctx-smollm2-135m``) and of
``test3``, beside a fixed keep of the same mean fraction of the tokens (McNemar on the questions), with
Wilson intervals. Every document is taken as one (the passages of a multi-passage question are not
ranked apart). Writes ``OUT/results.json`` (``summary`` rows for ``masklab report``) and per-question
outcomes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAL = ROOT / "results" / "realdocs-cross-smollm2-135m" / "results_corpus-val.json"
TESTS = {
    "test2": ROOT / "results" / "realdocs-ctx-smollm2-135m" / "results_test2.json",
    "test3": ROOT / "results" / "realdocs-cross-smollm2-135m" / "results_test3.json",
}


def outcomes(
    rows: list[dict], router: str, value: float | None, rule: str, neighbours: int, fraction: float | None = None
) -> list[tuple[bool, float]]:
    """Each question's ``(all evidence kept, kept share of tokens)`` under a keep rule (``value``,
    ``rule``) or, given ``fraction``, a fixed keep of that share."""
    import torch

    from masklab.text.selection import auto_fraction, select

    out = []
    for r in rows:
        s, lengths = torch.tensor(r[router]["scores"]), r["lengths"]
        keep = fraction if fraction is not None else auto_fraction(s, lengths, value, rule, neighbours)
        kept = set(select(s, lengths, min(1.0, max(keep, 1e-9)), context=neighbours))
        out.append((all(u in kept for g in r["gold"] for u in g), sum(lengths[i] for i in kept) / sum(lengths)))
    return out


def figures(res: list[tuple[bool, float]]) -> dict:
    from masklab.lab.stats import wilson

    k = sum(a for a, _ in res)
    lo, hi = wilson(k, len(res))
    return {
        "n": len(res),
        "kept": k / len(res),
        "kept_lo": lo,
        "kept_hi": hi,
        "fraction": sum(f for _, f in res) / len(res),
    }


def main() -> int:
    from masklab.lab.routers import load_any
    from masklab.lab.routers.cross import SHIPPED
    from masklab.lab.stats import mcnemar
    from masklab.text.selection import KEEP_RULES
    from masklab.util.files import write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=float, default=0.95, help="the share of val questions whose evidence must be kept")
    ap.add_argument("--routers", default="pruner-ctx,cross", help="comma-separated routers that decide how much")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "keep-rules", help="output folder")
    a = ap.parse_args()
    val = json.loads(VAL.read_text())["rows"]
    tests = {name: json.loads(p.read_text())["rows"] for name, p in TESTS.items()}
    out = {
        "command": "python scripts/keep_rules.py " + f"--target {a.target} --routers {a.routers}",
        "val": str(VAL.relative_to(ROOT)),
        "tests": {k: str(p.relative_to(ROOT)) for k, p in TESTS.items()},
        "target": a.target,
        "routers": {},
        "summary": [],
    }
    for name in a.routers.split(","):
        router = load_any(name, **({"path": SHIPPED} if name == "cross" else {}))  # cross: the lab's, its file
        nb = router.neighbours
        best = None
        for rule in KEEP_RULES:
            scores = sorted(
                {
                    round(x / (max(r[name]["scores"]) if rule == "relative" else 1), 3)
                    for r in val
                    for x in r[name]["scores"]
                }
            )
            for value in scores[:: max(1, len(scores) // 200)]:  # about 200 values of each rule
                fig = figures(outcomes(val, name, value, rule, nb))
                if fig["kept"] >= a.target and (best is None or fig["fraction"] < best["val"]["fraction"]):
                    best = {"rule": rule, "value": value, "val": fig}
        shipped = {"rule": router.keep_rule, "value": router.keep_auto}
        rec = {"neighbours": nb, "chosen": best, "shipped": shipped, "splits": {}}
        for split, rows in tests.items():
            if name not in rows[0]:
                continue
            for label, r in (("chosen", best), ("shipped", shipped)):
                if r is None or r["value"] is None:
                    continue
                if name == "cross" and label == "shipped":
                    continue  # its stored scores precede the Platt scaling its file now carries
                auto = outcomes(rows, name, r["value"], r["rule"], nb)
                fa = figures(auto)
                fixed = outcomes(rows, name, None, r["rule"], nb, fraction=fa["fraction"])
                ff = figures(fixed)
                cell = {
                    "auto": fa,
                    "fixed": ff,
                    "p_vs_fixed": mcnemar([x for x, _ in auto], [x for x, _ in fixed]),
                    "rows": [
                        {"id": q["id"], "kind": q["kind"], "auto": x, "auto_fraction": f, "fixed": y}
                        for q, (x, f), (y, _) in zip(rows, auto, fixed)
                    ],
                }
                rec["splits"].setdefault(split, {})[label] = cell
                out["summary"].append(
                    {
                        "task": f"{split}-{label}",
                        "method": name,
                        "n": fa["n"],
                        "kept": fa["kept"],
                        "kept_lo": fa["kept_lo"],
                        "kept_hi": fa["kept_hi"],
                        "fraction": fa["fraction"],
                        "fixed_kept": ff["kept"],
                        "p_vs_fixed": cell["p_vs_fixed"],
                    }
                )
                print(
                    f"{name} {label:<8} {split}: kept {fa['kept']:.3f} [{fa['kept_lo']:.2f}, {fa['kept_hi']:.2f}] "
                    f"at {fa['fraction']:.3f} of the tokens; fixed keep {ff['kept']:.3f} (p {cell['p_vs_fixed']:.3f})"
                )
        if best is not None:
            out["summary"].append(
                {
                    "task": "val-chosen",
                    "method": name,
                    "n": best["val"]["n"],
                    "kept": best["val"]["kept"],
                    "fraction": best["val"]["fraction"],
                    "rule": best["rule"],
                    "value": best["value"],
                }
            )
            print(
                f"{name} chosen on val: {best['rule']} {best['value']} keeps {best['val']['kept']:.3f} at "
                f"{best['val']['fraction']:.3f} of the tokens"
            )
        out["routers"][name] = rec
    write_json(a.out / "results.json", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
