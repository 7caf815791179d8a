"""``pruner-passage``: the pruner's scores read in each unit's paragraph and section (or passage), with a
second hop from the best unit (:mod:`masklab.context.passage`)."""

from __future__ import annotations

from pathlib import Path

from masklab.context.router import ROUTERS, Scores
from masklab.context.routers.pruner import WEIGHTS, ContextPruner


@ROUTERS.register("pruner-passage")
class PassagePruner(ContextPruner):
    """``path``: a passage head file (``scripts/train_passage.py``; None: the shipped one), read on top of the
    shipped `pruner`; ``int8`` as ``pruner-ctx``'s. Scores are keep probabilities in [0, 1]."""

    use = (
        "any document, and several passages: each unit read with its paragraph, its section or passage (by "
        "embedding and BM25, headings included) and a second hop from the best unit; --threshold or --keep auto"
    )
    variant = "two-hop"

    @classmethod
    def weights_file(cls, path: str | Path | None = None) -> Path:
        return Path(path) if path is not None else WEIGHTS / f"passage-{cls.variant}.safetensors"

    @classmethod
    def features(cls) -> tuple[str, ...]:
        from masklab.context.passage import FEATURES

        return FEATURES

    def read(self, doc, questions):
        import torch

        from masklab.context.passage import hop_query, passage_features, together

        emb = self.pruner.embedder
        units, qs = emb.units(doc.units), emb.encode(list(questions))  # (N, D), (Q, D)
        first = units @ qs.T  # (N, Q): the first hop's cosines
        hops = emb.encode([hop_query(q, doc, first[:, k]) for k, q in enumerate(questions)])
        with torch.no_grad():
            return Scores(
                [
                    together(doc, torch.sigmoid(self.head(*passage_features(doc, units, q, h, question))))
                    for q, h, question in zip(qs, hops, questions)
                ]
            )
