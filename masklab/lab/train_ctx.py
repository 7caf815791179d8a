"""Training the context pruner's head (``pruner-ctx``, :mod:`masklab.context.contextual`) and choosing
its selection on val: what ``masklab train-router --kind pruner-ctx`` and ``scripts/train_ctx.py`` run.

The head reads the shipped round-5 pruner's unit embeddings, so every document is embedded once by
that encoder and a head trains in seconds. Training (:func:`train`): the listwise loss of round 5
(softmax over the document's units of ``(s + residual) / TEMPERATURE`` against the uniform
distribution on the target units), then the calibration fitted by logistic regression on the
training units. On the corpus (:func:`run_corpus`), the label variants of :data:`VARIANTS` are
trained on the same questions and measured on val only: the corpus's ``val`` documents and the
benchmark's ``val`` split, the writers' marks as the truth (MRR, kept@0.1, kept@0.25); the round-5
pruner is measured beside on the same questions, with paired tests (sign flips on MRR, McNemar on
kept). The selection's ``context`` (0, 1 or 2 units on each side of the best one kept right after
it) is the one with the best val kept@0.1, per variant. ``--keep auto``'s rule: each rule of
:data:`RULES` (a plain score threshold, a share of the best unit's score, a share of the scores'
sum) at its parameter whose mean kept fraction on val is the smallest keeping the answer at least
as often as keep 0.25 does; the rule that needs the fewest tokens ships (``keep_rule`` and
``keep_auto`` in its ``.json``), and a fixed keep of each rule's mean token share is measured
beside it (McNemar).
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from masklab.context.contextual import FEATURES, TEMPERATURE, ContextHead, neighbourhood, probabilities
from masklab.util.errors import MasklabError

ROOT = Path(__file__).resolve().parents[2]  # the repository (results/ lives there)
CORPUS_LABELS = ROOT / "results" / "corpus-labels"


@dataclass
class Example:
    """One training question: its document's unit embeddings, the question's, the targets."""

    units: Tensor
    q: Tensor
    target: list[int]
    feats: tuple[Tensor, Tensor] | None = None  # (s, x) computed by the caller (the passage pruner's features)


@dataclass
class HeadConfig:
    epochs: int = 60
    lr: float = 3e-3
    weight_decay: float = 1e-3
    seed: int = 0


def train(examples: list[Example], cfg: HeadConfig) -> tuple[ContextHead, dict]:
    """Fit a :class:`ContextHead` (module docstring); returns it and a record (loss per epoch,
    the calibration, seconds)."""
    usable = [e for e in examples if e.target and (e.units if e.feats is None else e.feats[0]).shape[0] > 1]
    if not usable:
        raise MasklabError("no training question has a target unit: nothing to learn from")
    torch.manual_seed(cfg.seed)
    feats = [e.feats or neighbourhood(e.units, e.q) for e in usable]
    head = ContextHead(feats[0][1].shape[1])
    opt = torch.optim.AdamW(head.mlp.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    order, losses, t0 = list(range(len(usable))), [], time.perf_counter()
    for _ in range(cfg.epochs):
        rng.shuffle(order)
        total = 0.0
        for b in range(0, len(order), 16):
            opt.zero_grad()
            loss = torch.zeros(())
            for k in order[b : b + 16]:
                s, x = feats[k]
                logp = (head.rank_scores(s, x) / TEMPERATURE).log_softmax(-1)
                loss = loss - logp[usable[k].target].mean()
            (loss / len(order[b : b + 16])).backward()
            opt.step()
            total += float(loss.detach())
        losses.append(total / len(order))
    with torch.no_grad():  # the logistic calibration of the ranking score: keep probabilities
        r = torch.cat([head.rank_scores(*f) for f in feats])
        y = torch.cat(
            [torch.zeros(f[0].numel()).index_fill_(0, torch.tensor(e.target), 1.0) for e, f in zip(usable, feats)]
        )
    from sklearn.linear_model import LogisticRegression

    lr = LogisticRegression(C=10.0).fit(r[:, None].numpy(), y.numpy())
    head.calibration.copy_(torch.tensor([float(lr.coef_[0, 0]), float(lr.intercept_[0])]))
    head.eval()
    return head, {
        "examples": len(usable),
        "loss": losses,
        "calibration": head.calibration.tolist(),
        "seconds": time.perf_counter() - t0,
        "config": asdict(cfg),
    }


def save(head: ContextHead, path: Path, meta: dict, features: tuple[str, ...] = FEATURES) -> None:
    """``path`` (``.safetensors``: the head) and ``path.with_suffix(".json")`` (``features``: the ones it reads)."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(path))
    path.with_suffix(".json").write_text(
        json.dumps({"design": "context-head", "features": list(features), **meta}, indent=1) + "\n"
    )


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
    raise MasklabError(f"unknown label variant {variant!r}; choose from {', '.join(VARIANTS)}")


def material(model: str, tok) -> tuple[dict, dict, dict, list, dict]:
    """The training labels (round-5 and keep-set rows by question id), the corpus questions by id,
    the val questions, and every one of their documents cut by ``tok``."""
    from masklab.lab.tasks import realdocs
    from masklab.text.document import segment
    from masklab.util.files import read_jsonl

    labels = CORPUS_LABELS
    lasso = {r["id"]: r for f in sorted(labels.glob(f"labels-{model}-train*.jsonl")) for r in read_jsonl(f)}
    if not lasso:
        raise MasklabError(
            f"no corpus labels for {model} in {labels} (scripts/label_corpus.py makes them): "
            "train on your own documents instead (--docs, --questions)"
        )
    keepset_file = labels / f"labels-keepset-{model}-train.jsonl"
    keepset = {r["id"]: r for r in read_jsonl(keepset_file)} if keepset_file.is_file() else {}
    corpus = {q.id: q for q in realdocs.load("all", realdocs.CORPUS)}
    val = realdocs.load("val", realdocs.CORPUS) + realdocs.load("val")
    docs: dict = {}
    for q in list(corpus.values()) + val:
        if q.doc not in docs:
            docs[q.doc] = segment(q.text, tok)
    return lasso, keepset, corpus, val, docs


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


def keep_rules(rows: list[dict], target: float, context: int = 0, grids: dict | None = None) -> list[dict]:
    """Each rule of :data:`RULES` at its parameter whose mean kept fraction is the smallest keeping the
    answer for at least ``target`` of the questions (``keep_auto``'s choice, made for every rule), beside
    a fixed keep of the same mean fraction (``fixed_kept``) and McNemar's p between the two. A rule's
    units (the top one and its ``context`` neighbours always) give a fraction that :func:`select` keeps,
    as ``keep="auto"`` has it (:func:`~masklab.text.selection.auto_fraction`). ``grids``: each rule's
    parameters to try (default :data:`GRIDS`; a threshold tries every score seen)."""
    from masklab.lab.stats import mcnemar
    from masklab.text.selection import around_top, select

    scores = [torch.tensor(r["scores"]) for r in rows]
    out = []
    for name, rule in RULES.items():
        grid = (grids or GRIDS).get(name) or sorted({round(x, 3) for r in rows for x in r["scores"]})
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
        fixed = kept_at(rows, frac, context)
        out.append(
            {
                "rule": name,
                "param": p,
                "kept": sum(kept) / len(rows),
                "fraction": frac,
                "fixed_kept": sum(fixed) / len(rows),
                "p_vs_fixed": mcnemar(kept, fixed),
            }
        )
    return out


def choose_context(rows: list[dict]) -> dict:
    """kept@0.1 and kept@0.25 with each of :data:`CONTEXTS` (the units on each side of the best one kept
    right after it, :func:`masklab.text.selection.select`), and the one chosen: the best kept@0.1 (ties:
    the fewer units)."""
    figs = {
        k: {f"kept@{round(keep * 100)}": sum(kept_at(rows, keep, k)) / len(rows) for keep in (0.1, 0.25)}
        for k in CONTEXTS
    }
    return {"by_context": figs, "context": max(CONTEXTS, key=lambda k: (figs[k]["kept@10"], -k))}


def run_corpus(
    model: str,
    variants: list[str],
    out: Path,
    command: str,
    epochs: int = HeadConfig.epochs,
    threads: int = 1,
    ship: tuple[str, ...] = (),
) -> dict:
    """Every label variant of ``variants`` trained on the corpus labels of ``model`` and measured on
    val (module docstring): ``out/results.json``, and ``out/ctx-VARIANT.safetensors`` (+ ``.json``) for
    each variant (``ship``: also into ``masklab/context/weights/pruner``). Returns the results."""
    from masklab.context.routers.pruner import WEIGHTS, cached_pruner
    from masklab.lab.revision import code_hash
    from masklab.lab.train_pruner import shipped_recipe, val_figures
    from masklab.pretrained.models import load
    from masklab.text.selection import KEEP_RULES
    from masklab.util.files import write_json

    for v in [*variants, *ship]:
        if v not in VARIANTS:
            raise MasklabError(f"unknown label variant {v!r}; choose from {', '.join(VARIANTS)}")
    t_all, c_all = time.perf_counter(), time.process_time()
    tok = load(model, threads=threads).tokenizer
    lasso, keepset, corpus, val, docs = material(model, tok)
    pruner, _ = cached_pruner(str(WEIGHTS / "causal.safetensors"))
    emb = pruner.embedder
    t0 = time.perf_counter()
    needed = {corpus[i].doc for i in lasso} | {q.doc for q in val}
    units = {d: emb.units(docs[d].units) for d in sorted(needed)}
    qvec = {
        q.id: v
        for q, v in zip(list(corpus.values()) + val, emb.encode([q.question for q in list(corpus.values()) + val]))
    }
    embed_s = time.perf_counter() - t0
    threshold = shipped_recipe()["threshold"]
    print(
        f"{len(lasso)} labelled questions ({len(keepset)} with keep-set labels); val: {len(val)}; "
        f"embedded in {embed_s:.0f} s",
        file=sys.stderr,
    )

    base = val_figures(lambda question, us: emb.units(us) @ emb.query(question), val, docs, tok)
    base["keep_auto"] = None
    base.update(choose_context(base["rows"]))  # the same selection rule on the round-5 pruner (a control)
    cfg = HeadConfig(epochs=epochs)
    res = {
        "command": command,
        "model": model,
        "code": code_hash("masklab.lab.train_ctx"),
        "config": cfg.__dict__,
        "lasso_threshold": threshold,
        "keepset_gain": KEEPSET_GAIN,
        "labelled": len(lasso),
        "keepset_labelled": len(keepset),
        "keepset_kinds": sorted({r["kind"] for r in keepset.values()}),
        "val_questions": len(val),
        "train_kinds": {k: sum(corpus[i].kind == k for i in lasso) for k in ("single", "two", "latest")},
        "embed_seconds": embed_s,
        "variants": {"pruner-round5": base},
    }
    heads = {}
    for v in variants:
        ex = [
            Example(units[corpus[i].doc], qvec[i], targets(r, keepset.get(i), v, threshold)) for i, r in lasso.items()
        ]
        head, rec = train(ex, cfg)
        heads[v] = head
        t0, c0 = time.perf_counter(), time.process_time()
        fig = val_figures(lambda question, us: probabilities(head, emb.units(us), emb.query(question)), val, docs, tok)
        fig.update(choose_context(fig["rows"]))
        fig["keep_rules"] = keep_rules(fig["rows"], fig["by_context"][fig["context"]]["kept@25"], fig["context"])
        fig["keep_auto"] = min(
            (r for r in fig["keep_rules"] if r["rule"] in KEEP_RULES), key=lambda r: r["fraction"], default=None
        )  # of the rules a router reads, the one needing the fewest tokens
        res["variants"][v] = {
            "train": rec,
            "val_wall_s": time.perf_counter() - t0,
            "val_cpu_s": time.process_time() - c0,
            "targets_per_question": sum(len(e.target) for e in ex) / len(ex),
            **fig,
        }
        print(v, {k: round(fig[k], 3) for k in ("mrr", "kept@10", "kept@25")}, fig["keep_auto"], file=sys.stderr)
    res["summary"] = summary_rows(res)
    compact(res)
    res["seconds"] = {"wall": time.perf_counter() - t_all, "cpu": time.process_time() - c_all}
    write_json(out / "results.json", res)
    for v in variants:
        f = res["variants"][v]
        auto = f["keep_auto"] or {}
        meta = {
            "labels": v,
            "model": model,
            "train": f["train"],
            "keep_auto": auto.get("param"),
            "keep_rule": auto.get("rule"),
            "context": f["context"],
            "val": {k: f[k] for k in ("n", "mrr", "kept@10", "kept@25")},
            "command": command,
            "code": res["code"],
        }
        for folder in (out, *([WEIGHTS] if v in ship else [])):
            save(heads[v], folder / f"ctx-{v}.safetensors", meta)
    return res


def summary_rows(res: dict) -> list[dict]:
    """One row per variant (and per keep rule): val figures, intervals and paired tests against round 5."""
    from masklab.lab.realdocs import sign_flip_p
    from masklab.lab.stats import mcnemar, wilson

    summary = []
    base = res["variants"]["pruner-round5"]
    b_rr = [1 / rank for rank in ranks(base["rows"])]
    for name, f in res["variants"].items():
        s = {"task": "val", "method": name, "n": f["n"], "mrr": f["mrr"]}
        for key in ("kept@10", "kept@25"):
            k = round(f[key] * f["n"])
            s[key], (s[f"{key}_lo"], s[f"{key}_hi"]) = f[key], wilson(k, f["n"])
        if name != "pruner-round5":
            rr = [1 / rank for rank in ranks(f["rows"])]
            s["p_mrr_vs_round5"] = sign_flip_p(rr, b_rr)
            s["p_kept@10_vs_round5"] = mcnemar(kept_at(f["rows"], 0.1), kept_at(base["rows"], 0.1))
            s["targets"] = f["targets_per_question"]
            s["train_s"] = f["train"]["seconds"]
            if f["keep_auto"]:
                s.update(
                    {
                        "auto_rule": f["keep_auto"]["rule"],
                        "auto_threshold": f["keep_auto"]["param"],
                        "auto_fraction": f["keep_auto"]["fraction"],
                        "auto_kept": f["keep_auto"]["kept"],
                        "fixed_kept": f["keep_auto"]["fixed_kept"],
                    }
                )
        s["context"] = f["context"]
        for k, fig in f["by_context"].items():  # k units beside the best: a rule any ranker can use
            s.update({f"{key}_context{k}": x for key, x in fig.items()})
        s["p_kept@10_context_vs_0"] = mcnemar(kept_at(f["rows"], 0.1, f["context"]), kept_at(f["rows"], 0.1))
        summary.append(s)
        summary += [{"task": f"keep-{name}", "method": r["rule"], "n": f["n"], **r} for r in f.get("keep_rules", [])]
    return summary


def compact(res: dict) -> None:
    """Each val question's lengths and marked units once (``val_rows``), each variant's scores to 4 digits."""
    first = next(iter(res["variants"].values()))["rows"]
    res["val_rows"] = [{"id": r["id"], "lengths": r["lengths"], "gold": r["gold"]} for r in first]
    for f in res["variants"].values():
        f["rows"] = [{"id": r["id"], "scores": [round(x, 4) for x in r["scores"]]} for r in f["rows"]]


def ranks(rows: list[dict]) -> list[int]:
    from masklab.lab.realdocs import rank_of

    return [rank_of(torch.tensor(r["scores"]), r["gold"]) for r in rows]


def kept_at(rows: list[dict], keep: float, context: int = 0) -> list[bool]:
    from masklab.text.selection import select

    return [
        all(
            u in set(select(torch.tensor(r["scores"]), r["lengths"], keep, fill=True, context=context))
            for g in r["gold"]
            for u in g
        )
        for r in rows
    ]
