"""The pruner: a sentence-embedding model adapted to rank the units an answering model
needs, trained on labels of real documents (:mod:`masklab.context.causal`).

Two designs over the packaged all-MiniLM-L6-v2, chosen on val (docs/context.md):

* ``head``: the encoder frozen, a learned linear map ``W (D, D)`` (identity at the start)
  applied to the question's and the units' embeddings before the cosine: a head on frozen
  features, whose unit embeddings the dense router's cache already holds;
* ``lora``: the encoder itself fine-tuned through low-rank adapters on its attention's query
  and value projections (PEFT's LoRA), merged into the weights when loaded.

Each question of the training set gives its window of units (the hard negatives BM25 and
the dense router proposed) and a target set among them; the loss is the cross-entropy of
the softmax over the window of ``cosine / TEMPERATURE`` against the uniform distribution
on the target set (a listwise ranking loss). Three label variants differ only in that set:

* ``causal``: the units whose surrogate weight (how much keeping the unit raises the
  written answer's log-likelihood, in nats) is above ``threshold``;
* ``attention``: as many units as the causal set has, the most attended (the control);
* ``marks``: the units the writers marked as answering.

A trained pruner is one safetensors file (the head's ``W`` or the adapters' weights) and a
JSON file beside it (design, labels, training data, val choices, ``keep_auto``: the score
from which ``--keep auto`` keeps a unit).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from masklab.context.embedder import Embedder, load_embedder
from masklab.errors import MasklabError

TEMPERATURE = 0.05  # sentence-transformers' MultipleNegativesRankingLoss scale of 20
LABELS = ("causal", "attention", "marks")
DESIGNS = ("head", "lora")
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["query", "value"]}


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
        return sorted(order[:len(causal)])
    if labels == "marks":
        return [row["window"].index(u) for u in row["marked"] if u in row["window"]]
    raise MasklabError(f"unknown labels {labels!r}; choose from {', '.join(LABELS)}")


def examples_of(rows: list[dict], questions: dict, tokenizer, labels: str, threshold: float) -> list[Example]:
    """One :class:`Example` per label row (:mod:`masklab.context.causal`); ``questions``: id ->
    the question it labels (its document cut by ``tokenizer`` as when it was labelled)."""
    from masklab.document import segment

    units: dict[str, list[str]] = {}
    out = []
    for r in rows:
        q = questions[r["id"]]
        if q.doc not in units:
            units[q.doc] = segment(q.text, tokenizer).units
        out.append(Example(q.question, [units[q.doc][i] for i in r["window"]], target_set(r, labels, threshold)))
    return out


SHIPPED = Path(__file__).resolve().parent / "weights" / "pruner" / "causal.json"


def shipped_recipe() -> dict:
    """The shipped pruner's design, causal threshold and ``keep_auto`` (chosen on val); the
    defaults of :class:`TrainConfig` where none is shipped."""
    meta = json.loads(SHIPPED.read_text()) if SHIPPED.is_file() else {}
    return {"design": meta.get("design", TrainConfig.design), "threshold": meta.get("threshold", TrainConfig.threshold),
            "keep_auto": meta.get("keep_auto")}


class PrunerModel(torch.nn.Module):
    """The embedder with the head's map or the adapters (module docstring)."""

    def __init__(self, design: str, embedder: Embedder | None = None) -> None:
        """``embedder``: the frozen encoder the head reads (the shared one by default); the
        adapters always get an encoder of their own (they change its weights)."""
        super().__init__()
        if design not in DESIGNS:
            raise MasklabError(f"unknown pruner design {design!r}; choose from {', '.join(DESIGNS)}")
        self.design = design
        self.embedder = (embedder or load_embedder()) if design == "head" else Embedder()
        self.W = torch.nn.Parameter(torch.eye(self.embedder.dim)) if design == "head" else None
        st = self.embedder.model
        st.eval()  # no dropout: the same scores in training and use
        if design == "lora":
            from peft import LoraConfig, get_peft_model

            # the adapters go into the encoder's layers in place; the wrapper is kept to merge them
            self.adapters = get_peft_model(st[0].auto_model, LoraConfig(**LORA))
        for n, p in st.named_parameters():
            p.requires_grad_(design == "lora" and "lora_" in n)

    def trainable(self) -> dict[str, Tensor]:
        if self.design == "head":
            return {"W": self.W}
        return {n: p for n, p in self.embedder.model.named_parameters() if p.requires_grad}

    def encode(self, texts: list[str]) -> Tensor:
        """``(N, D)`` unit-length embeddings, with gradients where the design trains."""
        if self.design == "head":  # the frozen embeddings through W
            return F.normalize(self.embedder.encode(texts).clone() @ self.W, dim=-1)
        st = self.embedder.model
        feats = st.preprocess(texts)
        return F.normalize(st(feats)["sentence_embedding"], dim=-1)

    def scores(self, question: str, units: list[str], frozen: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``(N,)`` cosines of ``question`` and ``units`` (training: with gradients); ``frozen``:
        the head's input embeddings ``(units (N, D), question (D,))``, computed once."""
        if frozen is not None:
            u, q = frozen
            return F.normalize(u @ self.W, dim=-1) @ F.normalize(q @ self.W, dim=-1)
        return self.encode(units) @ self.encode([question])[0]

    @torch.no_grad()
    def rank(self, question: str, units: list[str]) -> Tensor:
        """``(N,)`` the same cosines for use: the units' embeddings from the embedder's cache."""
        u, q = self.embedder.units(units), self.embedder.query(question)
        if self.design == "head":
            u, q = F.normalize(u @ self.W, dim=-1), F.normalize(q @ self.W, dim=-1)
        return u @ q


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
        frozen = {id(e): (model.embedder.encode(e.units).clone(), model.embedder.encode([e.question])[0].clone())
                  for e in usable}
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
            for e in order[b:b + cfg.batch]:
                logits = model.scores(e.question, e.units, frozen.get(id(e))) / TEMPERATURE
                logp = logits.log_softmax(-1)
                loss = loss - logp[e.target].mean()
            loss = loss / len(order[b:b + cfg.batch])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(order[b:b + cfg.batch])
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


def load_pruner(path: Path) -> tuple[PrunerModel, dict]:
    """The :class:`PrunerModel` of a file :func:`save` wrote (adapters merged), and its meta."""
    from safetensors.torch import load_file

    meta_path = path.with_suffix(".json")
    if not path.is_file() or not meta_path.is_file():
        raise MasklabError(f"no pruner at {path} (it needs {path.name} and {meta_path.name})")
    meta = json.loads(meta_path.read_text())
    model = PrunerModel(meta["design"])
    state = load_file(str(path))
    if meta["design"] == "head":
        model.W.data.copy_(state["W"])
    else:
        missing = set(model.trainable()) - set(state)
        if missing:
            raise MasklabError(f"{path} lacks adapter weights: {sorted(missing)[:3]}")
        named = dict(model.embedder.model.named_parameters())
        for k, v in state.items():
            named[k].data.copy_(v)
        model.adapters.merge_and_unload()  # in place: the encoder's layers become plain merged Linear layers
        model.embedder.clear_cache()
    for p in model.trainable().values():
        p.requires_grad_(False)
    return model, meta
