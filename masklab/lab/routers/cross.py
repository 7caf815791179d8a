"""``cross``: the cross-encoder pruner (:mod:`masklab.lab.cross`), a research router: the question read
together with each window of units, every unit scored beside its neighbours; scores are keep
probabilities, calibrated by the Platt scaling its file carries (``sigmoid(a * logit + b)``).

It left the product (docs/context.md, "Evidence across units and passages"): on the corpus's val
questions it ranks below the default ``pruner-ctx``, so its weights are not packaged. It reads the file
``scripts/train_cross.py`` writes (``results/cross/VARIANT.safetensors``; ``--ship VARIANT`` adds the
Platt scaling and the hops chosen on val: ``results/cross/shipped.safetensors``), given as ``path``.

For a long document a cascade: the shipped pruner's cosines choose the ``max_windows`` windows the
cross-encoder reads; a unit of a window it never read keeps ``pruner-ctx``'s calibrated keep
probability (the same pruner's embeddings read beside their neighbours), never a number made up on
the cross-encoder's scale. A second hop (``hops = 2``) reads the question followed by its best unit's
text, whole (:meth:`masklab.lab.cross.CrossPruner.windows`' ``then``), and each unit keeps the higher
of its two probabilities."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from masklab.context.router import Router, Scores
from masklab.lab.routers.registry import LAB_ROUTERS
from masklab.util.errors import MasklabError

RESULTS = Path(__file__).resolve().parents[3] / "results" / "cross"
SHIPPED = RESULTS / "shipped.safetensors"  # where scripts/train_cross.py --ship writes the calibrated file

MAX_WINDOWS = 16  # windows read per question (about 5,000 tokens of core units); more: the cascade chooses


@lru_cache(maxsize=2)
def _load(path: str, int8: bool):
    from masklab.lab.cross import load_cross

    model, meta = load_cross(Path(path))
    if int8:
        model.quantize()
    return model, meta


@LAB_ROUTERS.register("cross")
class CrossRouter(Router):
    """``path``: a cross pruner file (``scripts/train_cross.py``; required); ``int8``: its encoder's
    linear layers in int8; ``max_windows``: the windows read per question before the cascade."""

    use = (
        "a research router: the question read together with each window of units (Provence's recipe), "
        "a second hop from the best unit; below pruner-ctx on val; give its file (scripts/train_cross.py)"
    )
    score_range = (0.0, 1.0)
    options = ("path", "int8")

    def __init__(
        self, lm=None, path: str | Path | None = None, int8: bool = False, max_windows: int = MAX_WINDOWS
    ) -> None:
        super().__init__(lm)
        if path is None:
            raise MasklabError(
                f"the {self.name or 'cross'} router reads a trained file and none is packaged: give its path "
                f"(path=), e.g. {SHIPPED.relative_to(RESULTS.parents[1])}, which python scripts/train_cross.py "
                "--ship VARIANT writes"
            )
        self.path = Path(path)
        self.model, self.meta = _load(str(self.path), int8)
        self.keep_auto, self.keep_rule = self.meta.get("keep_auto"), self.meta.get("keep_rule", "threshold")
        self.neighbours, self.hops = self.meta.get("context", 0), self.meta.get("hops", 1)
        self.max_windows, self.int8 = max_windows, int8
        self.platt = tuple(self.meta.get("platt", (1.0, 0.0)))  # (a, b); none fitted: the model's own sigmoid
        self.bi = None  # pruner-ctx: its pruner's cosines choose a long document's windows, built the first time

    def probability(self, logits: torch.Tensor) -> torch.Tensor:
        """Keep probabilities ``(N,)`` of the model's keep logits ``(N,)``, Platt-scaled."""
        a, b = self.platt
        return torch.sigmoid(a * logits + b)

    def score(self, doc, question):
        return self.read(doc, [question]).values[0]

    @torch.no_grad()
    def read(self, doc, questions, then: list[int] | None = None):
        """Each question's keep probabilities; ``then``: for each question, the unit whose text follows it
        whole (the second hop's query, :meth:`read_hops`)."""
        then = then or [None] * len(questions)
        wins = [self.model.windows(q, doc.units, t) for q, t in zip(questions, then)]
        if all(len(w) <= self.max_windows for w in wins):
            logits = self.model.logits_many(list(questions), doc.units, then=then)
            return Scores([self.probability(s) for s in logits], max(len(w) for w in wins))
        if self.bi is None:
            from masklab.context.routers.pruner import ContextPruner

            self.bi = ContextPruner(self.lm, int8=self.int8)
        queries = [q if t is None else f"{q} {doc.units[t]}" for q, t in zip(questions, then)]
        unread = self.bi.read(doc, queries).values  # pruner-ctx's calibrated keep probabilities
        out = []
        for ws, query, s in zip(wins, queries, unread):  # the windows whose best unit the pruner ranks highest
            cos = self.bi.pruner.rank(query, doc.units)
            read = sorted(ws, key=lambda w: -float(cos[w.start : w.stop].max()))[: self.max_windows]
            probs = self.probability(torch.cat(self.model.window_logits(read)))
            s, k = s.clone(), 0
            for w in read:
                s[w.start : w.stop] = probs[k : k + w.stop - w.start]
                k += w.stop - w.start
            out.append(s)
        return Scores(
            out,
            self.max_windows,
            (
                f"the pruner chose the {self.max_windows} windows of {max(len(w) for w in wins)} that the "
                "cross-encoder read; the other units keep pruner-ctx's keep probabilities",
            ),
        )

    def read_hops(self, doc, questions):
        """:meth:`read`, then where :attr:`hops` is 2 a second hop: each question followed by its best unit's
        text, whole (not cut to the question's length), and each unit's higher probability of the two."""
        first = self.read(doc, questions)
        if self.hops < 2 or len(doc.units) < 2:
            return first
        again = self.read(doc, questions, then=[int(s.argmax()) for s in first.values])
        return Scores(
            [torch.maximum(a, b) for a, b in zip(first.values, again.values)],
            first.windows + again.windows,
            tuple(dict.fromkeys(first.notes + again.notes)),
        )
