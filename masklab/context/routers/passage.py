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

    @classmethod
    def weights_file(cls, path: str | Path | None = None) -> Path:
        return Path(path) if path is not None else WEIGHTS / "passage.safetensors"

    @classmethod
    def features(cls) -> tuple[str, ...]:
        from masklab.context.passage import FEATURES

        return FEATURES

    def read(self, doc, questions):
        """Each question's keep probabilities: the passage features (with the second hop's query embedded
        where the head reads a hop: its file's ``variant``), the head, and the pieces of a long sentence
        together."""
        import torch

        from masklab.context.passage import hop_query, masked, passage_features, together

        emb, variant = self.pruner.embedder, self.meta.get("variant", "two-hop")
        units, qs = emb.units(doc.units), emb.encode(list(questions))  # (N, D), (Q, D)
        hops = qs  # a head without the hop reads its features zeroed: no second query to embed
        if variant == "two-hop":
            first = units @ qs.T  # (N, Q): the first hop's cosines
            hops = emb.encode([hop_query(q, doc, first[:, k]) for k, q in enumerate(questions)])
        out = []
        with torch.no_grad():
            for q, h, question in zip(qs, hops, questions):
                s, x = passage_features(doc, units, q, h, question)
                out.append(together(doc, torch.sigmoid(self.head(s, masked(x, variant)))))
        return Scores(out)
