"""Train the context pruner's label variants (``pruner-ctx``) and measure them on val only.

    python scripts/train_ctx.py [--model smollm2-135m] [--labels lasso,keepset,union,attention,marks] [--ship union,attention]

The head (:mod:`masklab.context.contextual`) reads the shipped round-5 pruner's unit embeddings, so
every document of the corpus and of the benchmark's val split is embedded once by that encoder and
each variant trains in seconds. The label variants are those of ``scripts/train_cross.py``
(:func:`train_cross.targets`): the same questions, head, steps and seed, only the target sets differ.
Val (never trained on): the corpus's ``val`` documents and the benchmark's ``val`` split, the writers'
marks as the truth (``scripts/train_pruner.py``'s figures: MRR, kept@0.1, kept@0.25); the round-5
pruner is measured beside on the same questions, with paired tests (sign flips on MRR, McNemar on
kept). The selection's ``context`` (0, 1 or 2 units on each side of the best one kept right after it) is
the one with the best val kept@0.1, per variant (the round-5 pruner's is measured too: a rule any ranker
can use). ``--keep auto``'s rule: each rule of :data:`RULES` (a plain score threshold, a share of the
best unit's score, a share of the scores' sum) at its parameter whose mean kept fraction on val is
the smallest keeping the answer at least as often as keep 0.25 does; the rule that needs the fewest
tokens ships (``keep_rule`` and ``keep_auto`` in its ``.json``), and a fixed keep of each rule's
mean token share is measured beside it (McNemar). Writes ``results/ctx/results.json`` (wall and CPU seconds included);
``--ship`` copies the named variants to ``masklab/context/weights/pruner/ctx-VARIANT.safetensors``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def _mass(s: torch.Tensor, p: float) -> torch.Tensor:
    """``(N,)`` the best units until they hold a share ``p`` of the scores' sum."""
    order = torch.argsort(s, descending=True, stable=True)
    n = int((s[order].cumsum(0) / s.sum() < p).sum()) + 1
    return torch.zeros_like(s, dtype=torch.bool).index_fill_(0, order[:n], True)


RULES = {  # --keep auto's candidate rules: the units kept for a parameter p of each question's scores (N,)
    "threshold": lambda s, p: s >= p,  # Provence's: every unit scoring at least p
    "relative": lambda s, p: s >= p * s.max(),  # every unit within a share p of the best unit's score
    "mass": _mass,  # more units where the scores are spread, fewer where one stands out
}
GRIDS = {"relative": [i / 100 for i in range(1, 100)], "mass": [i / 100 for i in range(5, 100)]}
CONTEXTS = (0, 1, 2)  # units on each side of the best one that may be kept right after it


def keep_rules(rows: list[dict], target: float, context: int = 0) -> list[dict]:
    """Each rule of :data:`RULES` at its parameter whose mean kept fraction is the smallest keeping the
    answer for at least ``target`` of the questions (``keep_auto``'s choice, made for every rule), beside
    a fixed keep of the same mean fraction (``fixed_kept``) and McNemar's p between the two. A rule's
    units (the top one and its ``context`` neighbours always) give a fraction that :func:`select` keeps,
    as ``Router.resolve_keep`` has it."""
    from masklab.lab.stats import mcnemar
    from masklab.text.selection import around_top, select

    scores = [torch.tensor(r["scores"]) for r in rows]
    out = []
    for name, rule in RULES.items():
        grid = GRIDS.get(name) or sorted({round(x, 3) for r in rows for x in r["scores"]})
        best = None
        for p in grid:
            kept, frac = [], 0.0
            for r, s in zip(rows, scores):
                mask = rule(s, p)
                mask[[int(torch.argsort(s, descending=True, stable=True)[0]), *around_top(s, context)]] = True
                f = sum(n for n, m in zip(r["lengths"], mask.tolist()) if m) / sum(r["lengths"])
                keep = set(select(s, r["lengths"], f, context=context))
                kept.append(all(u in keep for g in r["gold"] for u in g))
                frac += f / len(rows)
            if sum(kept) >= target * len(rows) and (best is None or frac < best[2]):
                best = (p, kept, frac)
        if best is None:
            continue
        p, kept, frac = best
        fixed = _kept(rows, frac, context)
        out.append({"rule": name, "param": p, "kept": sum(kept) / len(rows), "fraction": frac,
                    "fixed_kept": sum(fixed) / len(rows), "p_vs_fixed": mcnemar(kept, fixed)})
    return out


def choose_context(rows: list[dict]) -> dict:
    """kept@0.1 and kept@0.25 with each of :data:`CONTEXTS` (the units on each side of the best one kept
    right after it, :func:`masklab.text.selection.select`), and the one chosen: the best kept@0.1 (ties:
    the fewer units)."""
    figs = {k: {f"kept@{round(keep * 100)}": sum(_kept(rows, keep, k)) / len(rows) for keep in (0.1, 0.25)}
            for k in CONTEXTS}
    return {"by_context": figs, "context": max(CONTEXTS, key=lambda k: (figs[k]["kept@10"], -k))}


def main() -> int:
    from masklab.context import contextual
    from masklab.lab.train_pruner import shipped_recipe
    from masklab.lab.realdocs import sign_flip_p
    from masklab.context.routers.pruner import WEIGHTS, cached_pruner
    from masklab.util.files import write_json
    from masklab.pretrained.models import load
    from masklab.lab.revision import code_hash
    from masklab.lab.stats import mcnemar, wilson
    from train_cross import KEEPSET_GAIN, VARIANTS, material, targets
    from masklab.text.selection import KEEP_RULES
    from train_pruner import val_figures

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="the model whose labels train (and whose tokenizer cuts units)")
    ap.add_argument("--labels", default=",".join(VARIANTS), help="comma-separated variants: " + ", ".join(VARIANTS))
    ap.add_argument("--epochs", type=int, default=contextual.HeadConfig.epochs, help="training epochs")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--ship", default="", help="comma-separated variants to copy into masklab/context/weights/pruner")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    variants = a.labels.split(",")
    for v in variants + [x for x in a.ship.split(",") if x]:
        if v not in VARIANTS:
            raise SystemExit(f"unknown label variant {v!r}; choose from {', '.join(VARIANTS)}")
    t_all, c_all = time.perf_counter(), time.process_time()
    tok = load(a.model, threads=a.threads).tokenizer
    lasso, keepset, corpus, val, docs = material(a.model, tok)
    pruner, _ = cached_pruner(str(WEIGHTS / "causal.safetensors"))
    emb = pruner.embedder
    t0 = time.perf_counter()
    needed = {corpus[i].doc for i in lasso} | {q.doc for q in val}
    units = {d: emb.units(docs[d].units) for d in sorted(needed)}
    qvec = {q.id: v for q, v in zip(list(corpus.values()) + val,
                                    emb.encode([q.question for q in list(corpus.values()) + val]))}
    embed_s = time.perf_counter() - t0
    threshold = shipped_recipe()["threshold"]
    print(f"{len(lasso)} labelled questions ({len(keepset)} with keep-set labels); val: {len(val)}; "
          f"embedded in {embed_s:.0f} s", file=sys.stderr)

    base = val_figures(lambda question, us: emb.units(us) @ emb.query(question), val, docs, tok)
    base["keep_auto"] = None
    base.update(choose_context(base["rows"]))  # the same selection rule on the round-5 pruner (a control)
    cfg = contextual.HeadConfig(epochs=a.epochs)
    res = {"command": "python scripts/train_ctx.py " + " ".join(sys.argv[1:]), "model": a.model,
           "code": code_hash("masklab.context.contextual"), "config": cfg.__dict__, "lasso_threshold": threshold,
           "keepset_gain": KEEPSET_GAIN, "labelled": len(lasso), "keepset_labelled": len(keepset),
           "keepset_kinds": sorted({r["kind"] for r in keepset.values()}), "val_questions": len(val),
           "train_kinds": {k: sum(corpus[i].kind == k for i in lasso) for k in ("single", "two", "latest")},
           "embed_seconds": embed_s, "variants": {"pruner-round5": base}}
    heads = {}
    for v in variants:
        ex = [contextual.Example(units[corpus[i].doc], qvec[i], targets(r, keepset.get(i), v, threshold))
              for i, r in lasso.items()]
        head, rec = contextual.train(ex, cfg)
        heads[v] = head
        t0, c0 = time.perf_counter(), time.process_time()
        fig = val_figures(lambda question, us: contextual.probabilities(head, emb.units(us), emb.query(question)), val,
                          docs, tok)
        fig.update(choose_context(fig["rows"]))
        fig["keep_rules"] = keep_rules(fig["rows"], fig["by_context"][fig["context"]]["kept@25"], fig["context"])
        fig["keep_auto"] = min((r for r in fig["keep_rules"] if r["rule"] in KEEP_RULES), key=lambda r: r["fraction"],
                               default=None)  # of the rules a router reads, the one needing the fewest tokens
        res["variants"][v] = {"train": rec, "val_wall_s": time.perf_counter() - t0, "val_cpu_s": time.process_time() - c0,
                              "targets_per_question": sum(len(e.target) for e in ex) / len(ex), **fig}
        print(v, {k: round(fig[k], 3) for k in ("mrr", "kept@10", "kept@25")}, fig["keep_auto"], file=sys.stderr)
    summary = []
    b_rr = [1 / rank for rank in _ranks(base["rows"])]
    for name, f in res["variants"].items():
        s = {"task": "val", "method": name, "n": f["n"], "mrr": f["mrr"]}
        for key in ("kept@10", "kept@25"):
            k = round(f[key] * f["n"])
            s[key], (s[f"{key}_lo"], s[f"{key}_hi"]) = f[key], wilson(k, f["n"])
        if name != "pruner-round5":
            rr = [1 / rank for rank in _ranks(f["rows"])]
            s["p_mrr_vs_round5"] = sign_flip_p(rr, b_rr)
            s["p_kept@10_vs_round5"] = mcnemar(_kept(f["rows"], 0.1), _kept(base["rows"], 0.1))
            s["targets"] = f["targets_per_question"]
            s["train_s"] = f["train"]["seconds"]
            if f["keep_auto"]:
                s.update({"auto_rule": f["keep_auto"]["rule"], "auto_threshold": f["keep_auto"]["param"],
                          "auto_fraction": f["keep_auto"]["fraction"], "auto_kept": f["keep_auto"]["kept"],
                          "fixed_kept": f["keep_auto"]["fixed_kept"]})
        s["context"] = f["context"]
        for k, fig in f["by_context"].items():  # the selection with k units beside the best: a rule any ranker can use
            s.update({f"{key}_context{k}": x for key, x in fig.items()})
        s["p_kept@10_context_vs_0"] = mcnemar(_kept(f["rows"], 0.1, f["context"]), _kept(f["rows"], 0.1))
        summary.append(s)
        summary += [{"task": f"keep-{name}", "method": r["rule"], "n": f["n"], **r} for r in f.get("keep_rules", [])]
    res["summary"] = summary
    compact(res)
    res["seconds"] = {"wall": time.perf_counter() - t_all, "cpu": time.process_time() - c_all}
    out = ROOT / "results" / "ctx"
    write_json(out / "results.json", res)
    for v in [x for x in a.ship.split(",") if x]:
        f = res["variants"][v]
        contextual.save(heads[v], WEIGHTS / f"ctx-{v}.safetensors",
                        {"labels": v, "model": a.model, "train": f["train"], "keep_auto": f["keep_auto"] and
                         f["keep_auto"]["param"], "keep_rule": f["keep_auto"] and f["keep_auto"]["rule"],
                         "context": f["context"],
                         "val": {k: f[k] for k in ("n", "mrr", "kept@10", "kept@25")},
                         "command": res["command"], "code": res["code"]})
    for s in summary:
        print({k: round(x, 3) if isinstance(x, float) else x for k, x in s.items()})
    return 0


def compact(res: dict) -> None:
    """Each val question's lengths and marked units once (``val_rows``), each variant's scores to 4 digits."""
    first = next(iter(res["variants"].values()))["rows"]
    res["val_rows"] = [{"id": r["id"], "lengths": r["lengths"], "gold": r["gold"]} for r in first]
    for f in res["variants"].values():
        f["rows"] = [{"id": r["id"], "scores": [round(x, 4) for x in r["scores"]]} for r in f["rows"]]


def _ranks(rows: list[dict]) -> list[int]:
    from masklab.lab.realdocs import rank_of

    return [rank_of(torch.tensor(r["scores"]), r["gold"]) for r in rows]


def _kept(rows: list[dict], keep: float, context: int = 0) -> list[bool]:
    from masklab.text.selection import select

    return [all(u in set(select(torch.tensor(r["scores"]), r["lengths"], keep, fill=True, context=context))
                for g in r["gold"] for u in g) for r in rows]


if __name__ == "__main__":
    raise SystemExit(main())
