"""``pruner-passage``: the pruner's scores read in each unit's paragraph and section (or passage), with a
second hop from the best unit (:mod:`masklab.context.passage`)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from masklab.context.router import ROUTERS, Router, Scores
from masklab.context.routers.pruner import WEIGHTS, cached_int8_pruner, cached_pruner


@lru_cache(maxsize=2)
def _load_head(path: str):
    from masklab.context.contextual import load_head
    from masklab.context.passage import FEATURES

    return load_head(Path(path), FEATURES)


@ROUTERS.register("pruner-passage")
class PassagePruner(Router):
    """``path``: a passage head file (``scripts/train_passage.py``; None: the shipped one), read on top of the
    shipped `pruner`. Scores are keep probabilities in [0, 1]."""

    use = (
        "any document, and several passages: each unit read with its paragraph, its section or passage (by "
        "embedding and BM25, headings included) and a second hop from the best unit; --threshold or --keep auto"
    )
    score_range = (0.0, 1.0)
    options = ("path", "int8")
    variant = "two-hop"

    def __init__(self, lm=None, path: str | Path | None = None, int8: bool = False) -> None:
        """``int8``: the pruner's encoder's linear layers in int8 (as ``pruner-ctx``'s)."""
        super().__init__(lm)
        self.path = Path(path) if path is not None else WEIGHTS / f"passage-{self.variant}.safetensors"
        self.head, self.meta = _load_head(str(self.path))
        self.pruner = (cached_int8_pruner if int8 else cached_pruner)(str(WEIGHTS / "causal.safetensors"))[0]
        self.keep_auto, self.keep_rule = self.meta.get("keep_auto"), self.meta.get("keep_rule", "threshold")
        self.neighbours = self.meta.get("context", 0)

    def score(self, doc, question):
        return self.read(doc, [question]).values[0]

    def read(self, doc, questions):
        from masklab.context.passage import hop_query, passage_features, together

        emb = self.pruner.embedder
        units, qs = emb.units(doc.units), emb.encode(list(questions))  # (N, D), (Q, D)
        first = units @ qs.T  # (N, Q): the first hop
        hops = emb.encode([hop_query(q, doc, first[:, k]) for k, q in enumerate(questions)])
        with torch.no_grad():
            return Scores(
                [
                    together(doc, torch.sigmoid(self.head(*passage_features(doc, units, q, h, question))))
                    for q, h, question in zip(qs, hops, questions)
                ]
            )
