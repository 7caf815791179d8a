"""``cross``: the cross-encoder pruner (:mod:`masklab.context.cross`): the question read together
with each window of units, every unit scored beside its neighbours; scores are keep probabilities,
calibrated by the Platt scaling its file carries (fitted on val: ``sigmoid(a * logit + b)``).
For a long document a cascade: the shipped pruner's cosines choose the ``max_windows`` windows
the cross-encoder reads, and the units of the other windows rank below every unit it read."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from masklab.context.router import ROUTERS, Router, Scores
from masklab.util.errors import MasklabError

WEIGHTS = Path(__file__).resolve().parent.parent / "weights" / "cross"

MAX_WINDOWS = 16  # windows read per question (about 5,000 tokens of core units); more: the cascade chooses


@lru_cache(maxsize=2)
def _load(path: str, int8: bool):
    from masklab.context.cross import load_cross

    model, meta = load_cross(Path(path))
    if int8:
        model.quantize()
    return model, meta


@ROUTERS.register("cross")
class CrossRouter(Router):
    """``path``: a cross pruner file (``scripts/train_cross.py``; None: the shipped one); ``int8``: its
    encoder's linear layers in int8; ``max_windows``: the windows read per question before the cascade."""

    use = (
        "questions whose evidence spans units: the question read together with each window of units "
        "(Provence's recipe), a second hop from the best unit; --threshold or --keep auto"
    )
    score_range = (0.0, 1.0)
    options = ("path", "int8")

    def __init__(
        self, lm=None, path: str | Path | None = None, int8: bool = False, max_windows: int = MAX_WINDOWS
    ) -> None:
        super().__init__(lm)
        self.path = Path(path) if path is not None else WEIGHTS / "cross.safetensors"
        if path is None and not self.path.is_file():
            raise MasklabError(
                "no cross pruner is shipped yet: train one (scripts/train_cross.py) and give its file "
                "(--router-file / path=)"
            )
        self.model, self.meta = _load(str(self.path), int8)
        self.keep_auto, self.keep_rule = self.meta.get("keep_auto"), self.meta.get("keep_rule", "threshold")
        self.neighbours, self.hops = self.meta.get("context", 0), self.meta.get("hops", 1)
        self.max_windows, self.int8 = max_windows, int8
        self.platt = tuple(self.meta.get("platt", (1.0, 0.0)))  # (a, b); none fitted: the model's own sigmoid
        self.bi = None  # the pruner whose cosines choose the windows of a long document, built the first time

    def probability(self, logits: torch.Tensor) -> torch.Tensor:
        """Keep probabilities ``(N,)`` of the model's keep logits ``(N,)``, Platt-scaled."""
        a, b = self.platt
        return torch.sigmoid(a * logits + b)

    def score(self, doc, question):
        return self.read(doc, [question]).values[0]

    @torch.no_grad()
    def read(self, doc, questions):
        wins = [self.model.windows(q, doc.units) for q in questions]
        if all(len(w) <= self.max_windows for w in wins):
            probs = [self.probability(s) for s in self.model.logits_many(list(questions), doc.units)]
            return Scores(probs, max(len(w) for w in wins))
        if self.bi is None:
            from masklab.context.routers.pruner import Pruner

            self.bi = Pruner(self.lm, int8=self.int8)
        bi = self.bi.read(doc, questions).values
        out = []
        for ws, cos in zip(wins, bi):  # the windows whose best unit the bi-encoder ranks highest
            read = sorted(ws, key=lambda w: -float(cos[w.start : w.stop].max()))[: self.max_windows]
            probs = self.probability(torch.cat(self.model.window_logits(read)))
            floor = float(probs.min())
            s = floor * 0.5 * (cos + 1) / 2  # unread units: below every read one, in the bi-encoder's order
            k = 0
            for w in read:
                s[w.start : w.stop] = probs[k : k + w.stop - w.start]
                k += w.stop - w.start
            out.append(s)
        return Scores(
            out,
            self.max_windows,
            (
                f"the pruner chose the {self.max_windows} windows of "
                f"{max(len(w) for w in wins)} that the cross-encoder read",
            ),
        )
