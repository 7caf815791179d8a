"""Training the pruner (:mod:`masklab.context.pruner`) on labels of real documents
(:mod:`masklab.lab.labels`).

Each question of the training set gives its window of units (the hard negatives BM25 and
the dense router proposed) and a target set among them; the loss is the cross-entropy of
the softmax over the window of ``cosine / TEMPERATURE`` against the uniform distribution
on the target set (a listwise ranking loss). Three label variants differ only in that set:

* ``causal``: the units whose surrogate weight (how much keeping the unit raises the
  written answer's log-likelihood, in nats) is above ``threshold``;
* ``attention``: as many units as the causal set has, the most attended (the control);
* ``marks``: the units the writers marked as answering.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from masklab.context.pruner import PrunerModel
from masklab.context.routers.pruner import WEIGHTS
from masklab.util.errors import MasklabError

TEMPERATURE = 0.05  # sentence-transformers' MultipleNegativesRankingLoss scale of 20
LABELS = ("causal", "attention", "marks")


@dataclass
class Example:
    """One training question: its window's unit texts and the target units (indices into them)."""

    question: str
    units: list[str]
    target: list[int]


@dataclass
class TrainConfig:
    design: str = "head"
    labels: str = "causal"
    threshold: float = 1.0  # nats: the causal set's floor
    epochs: int | None = None  # None: 12 for the head, 3 for the adapters (an encoder pass per unit: 20x the time)
    lr: float | None = None  # None: 1e-3 for the head, 5e-4 for the adapters
    batch: int = 8  # questions per step
    seed: int = 0


def target_set(row: dict, labels: str, threshold: float) -> list[int]:
    """The target units (indices into ``row["window"]``) of one label row for ``labels``."""
    w = row["weights"]
    causal = [i for i, x in enumerate(w) if x > threshold]
    if labels == "causal":
        return causal
    if labels == "attention":
        order = sorted(range(len(w)), key=lambda i: -row["attention"][i])
        return sorted(order[: len(causal)])
    if labels == "marks":
        return [row["window"].index(u) for u in row["marked"] if u in row["window"]]
    raise MasklabError(f"unknown labels {labels!r}; choose from {', '.join(LABELS)}")


def examples_of(rows: list[dict], questions: dict, tokenizer, labels: str, threshold: float) -> list[Example]:
    """One :class:`Example` per label row (:mod:`masklab.lab.labels`); ``questions``: id ->
    the question it labels (its document cut by ``tokenizer`` as when it was labelled)."""
    from masklab.text.document import segment

    units: dict[str, list[str]] = {}
    out = []
    for r in rows:
        q = questions[r["id"]]
        if q.doc not in units:
            units[q.doc] = segment(q.text, tokenizer).units
        out.append(Example(q.question, [units[q.doc][i] for i in r["window"]], target_set(r, labels, threshold)))
    return out


SHIPPED = WEIGHTS / "causal.json"


def shipped_recipe() -> dict:
    """The shipped pruner's design, causal threshold and ``keep_auto`` (chosen on val); the
    defaults of :class:`TrainConfig` where none is shipped."""
    meta = json.loads(SHIPPED.read_text()) if SHIPPED.is_file() else {}
    return {
        "design": meta.get("design", TrainConfig.design),
        "threshold": meta.get("threshold", TrainConfig.threshold),
        "keep_auto": meta.get("keep_auto"),
    }


def val_figures(rank, val: list, docs: dict, tokenizer) -> dict:
    """MRR and kept@0.1 / @0.25 of ``rank(question, units)`` over the val questions, and the
    scores of each question (for ``--keep auto``'s threshold)."""
    from masklab.lab.realdocs import answering_units, rank_of
    from masklab.text.selection import select

    rr, kept10, kept25, rows = [], [], [], []
    for q in val:
        doc = docs[q.doc]
        gold = answering_units(doc, q.spans())
        s = rank(q.question, doc.units)
        lengths = doc.lengths(tokenizer)
        rr.append(1 / rank_of(s, gold))
        for keep, acc in ((0.1, kept10), (0.25, kept25)):
            k = set(select(s, lengths, keep, fill=True))
            acc.append(all(u in k for g in gold for u in g))
        rows.append({"id": q.id, "scores": s.tolist(), "lengths": lengths, "gold": gold})
    n = len(val)
    return {"n": n, "mrr": sum(rr) / n, "kept@10": sum(kept10) / n, "kept@25": sum(kept25) / n, "rows": rows}


def keep_auto(rows: list[dict], target: float) -> dict:
    """The score threshold whose kept fraction is smallest among those keeping the answer for at
    least ``target`` of the questions (every unit scoring at least it is kept; the top unit always)."""
    cands = sorted({round(x, 3) for r in rows for x in r["scores"]})
    best = None
    for t in cands:
        kept, frac = 0, 0.0
        for r in rows:
            s = torch.tensor(r["scores"])
            keep = set((s >= t).nonzero().flatten().tolist()) | {int(s.argmax())}
            kept += all(u in keep for g in r["gold"] for u in g)
            frac += sum(r["lengths"][i] for i in keep) / sum(r["lengths"])
        kept, frac = kept / len(rows), frac / len(rows)
        if kept >= target and (best is None or frac < best["fraction"]):
            best = {"threshold": t, "kept": kept, "fraction": frac}
    return best


def train(examples: list[Example], cfg: TrainConfig, progress: bool = True) -> tuple[PrunerModel, dict]:
    """Fit a :class:`PrunerModel` on ``examples`` (module docstring); returns it and a record
    of the training (loss per epoch, seconds)."""
    usable = [e for e in examples if e.target and len(e.units) > 1]
    if not usable:
        raise MasklabError("no training question has a target unit: nothing to learn from")
    torch.manual_seed(cfg.seed)
    model = PrunerModel(cfg.design)
    frozen = {}  # the head reads frozen embeddings: each example's computed once, not every epoch
    if cfg.design == "head":
        frozen = {
            id(e): (model.embedder.encode(e.units).clone(), model.embedder.encode([e.question])[0].clone())
            for e in usable
        }
    params = list(model.trainable().values())
    opt = torch.optim.AdamW(params, lr=cfg.lr or (1e-3 if cfg.design == "head" else 5e-4), weight_decay=0.0)
    rng = random.Random(cfg.seed)
    losses, t0 = [], time.perf_counter()
    epochs = cfg.epochs or (12 if cfg.design == "head" else 3)
    steps = epochs * ((len(usable) + cfg.batch - 1) // cfg.batch)
    bar = None
    if progress:
        import sys

        from tqdm import tqdm

        bar = tqdm(total=steps, desc=f"pruner {cfg.design}/{cfg.labels}", file=sys.stderr)
    for _ in range(epochs):
        order = usable[:]
        rng.shuffle(order)
        total = 0.0
        for b in range(0, len(order), cfg.batch):
            opt.zero_grad()
            loss = torch.zeros(())
            for e in order[b : b + cfg.batch]:
                logits = model.scores(e.question, e.units, frozen.get(id(e))) / TEMPERATURE
                logp = logits.log_softmax(-1)
                loss = loss - logp[e.target].mean()
            loss = loss / len(order[b : b + cfg.batch])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(order[b : b + cfg.batch])
            if bar is not None:
                bar.update()
        losses.append(total / len(order))
    if bar is not None:
        bar.close()
    return model, {"examples": len(usable), "epochs": epochs, "loss": losses, "seconds": time.perf_counter() - t0}


def save(model: PrunerModel, path: Path, meta: dict) -> None:
    """``path`` (``.safetensors``: the trained weights) and ``path.with_suffix(".json")``."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.trainable().items()}, str(path))
    path.with_suffix(".json").write_text(json.dumps({"design": model.design, **meta}, indent=1) + "\n")
