"""``bm25+evidence`` and ``bm25+dense``: BM25 proposes, a second router re-ranks.

On real documents a trained router alone can rank a unit that shares no word with the
question above the sentence that answers it; BM25 cannot, but it cannot tell the latest
of several statements of one fact from the older ones, nor the second link of a chain.
These routers add the trained router's within-document z-score to BM25's:

    score = z(bm25) + WEIGHT * z(trained)

so a unit with no word of the question starts far below BM25's best and must be ranked
high by the trained router to rise, while among units BM25 scores alike (restated facts,
words the question lacks) the trained router decides. How the two are combined
(:data:`FUSIONS`) and ``WEIGHT`` were chosen on the validation documents of the
real-document benchmark only (docs/context.md). The lab's ``bm25+attention``
(:mod:`masklab.lab.routers.controls`) is the control: the same combination with the router
trained on attention labels.
``bm25+dense`` adds the sentence-embedding router's z-score the same way, with its own
fusion chosen on val by the same kind of rule (:func:`masklab.lab.realdocs.choose`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from masklab.context.router import ROUTERS, Router, Scores
from masklab.context.routers.bm25 import BM25
from masklab.context.routers.dense import Dense
from masklab.context.routers.trained import EvidenceRouter
from masklab.util.errors import MasklabError

HOW, WEIGHT = "z", 2.0  # chosen on the benchmark's val documents by a rule fixed first (scripts/choose_fusion.py)
RRF_K = 60  # reciprocal-rank fusion's constant (Cormack et al.'s default)


def zscore(x: Tensor) -> Tensor:
    """``(N,)`` scores as z-scores within the document (zeros where they are all equal)."""
    x = x.float()
    sd = x.std() if x.numel() > 1 else x.new_zeros(())
    return (x - x.mean()) / sd if sd > 1e-9 else torch.zeros_like(x)


def _ranks(x: Tensor) -> Tensor:
    """1 for the best unit; tied units share the better rank (``(N,)`` float)."""
    return 1.0 + (x[None, :] > x[:, None]).sum(1).float()


def fuse(bm25: Tensor, trained: Tensor, how: str = HOW, weight: float = WEIGHT) -> Tensor:
    """``(N,)`` combined scores: ``z`` adds ``weight`` x the trained z-score to BM25's;
    ``rrf`` adds reciprocal ranks (the trained one times ``weight``); ``rerank`` orders
    BM25's best ``int(weight)`` units by the trained score, above the rest in BM25 order."""
    if how == "z":
        return zscore(bm25) + weight * zscore(trained)
    if how == "rrf":
        return 1 / (RRF_K + _ranks(bm25)) + weight / (RRF_K + _ranks(trained))
    if how == "rerank":
        top = torch.argsort(bm25, descending=True, stable=True)[: max(1, int(weight))]
        out = -_ranks(bm25)
        out[top] = len(bm25) + (zscore(trained[top]) if len(top) > 1 else 0.0)
        return out
    raise MasklabError(f"unknown fusion {how!r}; choose from {', '.join(FUSIONS)}")


FUSIONS = ("z", "rrf", "rerank")


class Fused(Router):
    """BM25 plus the router ``other_cls`` (module docstring), combined as ``how`` with
    ``weight`` (the class's chosen fusion unless given); ``options`` go to the other router
    (a trained one's ``path``, ``progress``, ``router_model``; dense's ``embedder``)."""

    reads_model = True
    options = EvidenceRouter.options
    fill = True
    other_cls: type = EvidenceRouter
    how, weight = HOW, WEIGHT

    def __init__(self, lm=None, how: str | None = None, weight: float | None = None, **options) -> None:
        super().__init__(lm)
        self.bm25 = BM25(lm)
        self.other = self.other_cls(lm, **options)
        self.notes = self.other.notes
        self.how = self.how if how is None else how
        self.weight = self.weight if weight is None else weight

    def score(self, doc, question):
        return self.read(doc, [question]).values[0]

    def read(self, doc, questions):
        """The other router's read of ``doc`` (its windows) fused with BM25's scores."""
        other = self.other.read(doc, questions)
        values = [fuse(self.bm25.score(doc, q), t, self.how, self.weight) for q, t in zip(questions, other.values)]
        return Scores(values, other.windows, other.notes)


@ROUTERS.register("bm25+evidence")
class BM25Evidence(Fused):
    """BM25 proposes, the evidence router re-ranks (module docstring)."""

    use = (
        "real documents where facts are restated or need two sentences (docs/context.md: above bm25 as "
        "measured, not decided); costs one pass of the model's first layers"
    )

    other_cls = EvidenceRouter


@ROUTERS.register("bm25+dense")
class BM25Dense(Fused):
    """BM25 plus the sentence-embedding router (module docstring)."""

    use = (
        "questions that repeat the document's words (names, options, messages) and paraphrases: the best MRR on "
        "the first test split as measured, not above dense on the second"
    )

    reads_model = False
    options = Dense.options
    other_cls = Dense
    how, weight = "z", 2.0  # chosen on val by a rule fixed first (scripts/choose_fusion.py)
