"""The pruner: a sentence-embedding model adapted to rank the units an answering model
needs, trained on labels of real documents (:mod:`masklab.lab.labels`) by
:mod:`masklab.lab.train_pruner`; this module holds the model and :func:`load_pruner`.

Two designs over the packaged all-MiniLM-L6-v2, chosen on val (docs/context.md):

* ``head``: the encoder frozen, a learned linear map ``W (D, D)`` (identity at the start)
  applied to the question's and the units' embeddings before the cosine: a head on frozen
  features, whose unit embeddings the dense router's cache already holds;
* ``lora``: the encoder itself fine-tuned through low-rank adapters on its attention's query
  and value projections (PEFT's LoRA), merged into the weights when loaded.

A trained pruner is one safetensors file (the head's ``W`` or the adapters' weights) and a
JSON file beside it (design, labels, training data, val choices, ``keep_auto``: the score
from which ``--keep auto`` keeps a unit).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from masklab.context.embedder import Embedder, load_embedder
from masklab.util.errors import MasklabError

DESIGNS = ("head", "lora")
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["query", "value"]}


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


def load_pruner(path: Path) -> tuple[PrunerModel, dict]:
    """The :class:`PrunerModel` of a file :func:`masklab.lab.train_pruner.save` wrote (adapters merged), and its
    meta."""
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
