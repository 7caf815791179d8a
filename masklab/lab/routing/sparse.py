"""Sparse inference: keep a budget of items, let the teacher answer from those alone.

Budgets (:func:`parse_budget`):

* an int ``k`` - the ``k`` best items (``k > n`` keeps all ``n``; ``k = 0`` keeps none and
  the teacher answers from the query alone);
* a fraction ``0 < f <= 1`` (written ``0.1`` or ``10%``) - the ``ceil(f * n)`` best items;
* ``"gold"`` - as many items as the example's gold evidence has (an oracle-sized budget);
* or, instead of a budget, a score ``threshold``: items whose ``sigmoid(score) >= threshold``.

Ties in the scores are broken by item index (the earlier item wins), so selections are
deterministic. The kept items are read by *dropping* the others from the sequence (the
cheap path: the teacher runs on ``k + 1`` tokens), which gives the same answer as masking
them in the attention bias because items keep their position ids (tested).

Selectors (registry :data:`SELECTORS`, one class each, one method ``score``) give the scores
that a budget turns into a keep-mask; they are the baselines a router is compared with:
``random``, ``recent`` (most recent items), ``teacher-attention`` (the teacher's own attention
from a dense pre-fill, SnapKV-style), ``oracle-gold`` and ``dense`` (keep everything).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from masklab.util import device as devices
from masklab.util.errors import MasklabError
from masklab.lab.evidence.attention_targets import aggregate_fn, attention_maps, top_k
from masklab.lab.evidence.interventions import MODES, answer_logits
from masklab.util.registry import Registry
from masklab.lab.routing.routers import TokenRouter, transformer_flops
from masklab.lab.tasks.evidence_gyms import EvidenceBatch

Budget = int | float | str


def parse_budget(text: str | int | float) -> Budget:
    """``"3"`` -> 3, ``"10%"`` or ``"0.1"`` -> 0.1, ``"gold"`` -> "gold"; anything else is an error."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value: Budget = text
    else:
        t = str(text).strip()
        try:
            if t == "gold":
                return t
            if t.endswith("%"):
                value = float(t[:-1]) / 100
            elif t.lstrip("-").isdigit():
                value = int(t)
            else:
                value = float(t)
        except ValueError:
            raise MasklabError(
                f"a budget is an item count (3), a fraction (0.1 or 10%) or 'gold'; got {text!r}"
            ) from None
    if isinstance(value, int) and value < 0 or isinstance(value, float) and not 0 < value <= 1:
        raise MasklabError(f"a budget must be a count >= 0 or a fraction in (0, 1]; got {text!r}")
    return value


def budget_label(budget: Budget) -> str:
    """A name for result keys: ``3``, ``10pct``, ``gold``."""
    if isinstance(budget, float):
        return f"{round(budget * 100, 6):g}pct"
    return str(budget)


def budget_k(budget: Budget, valid: Tensor, gold: Tensor | None = None) -> Tensor:
    """``(B,)`` number of items to keep per example (never more than it has)."""
    n = valid.sum(1)
    if budget == "gold":
        if gold is None:
            raise MasklabError("the 'gold' budget needs gold evidence")
        k = gold.sum(1)
    elif isinstance(budget, float):
        k = torch.tensor([math.ceil(budget * int(m)) for m in n], dtype=torch.long)
    else:
        k = torch.full_like(n, int(budget))
    return torch.minimum(k, n)


def keep_mask(
    scores: Tensor,
    valid: Tensor,
    budget: Budget | None = None,
    threshold: float | None = None,
    gold: Tensor | None = None,
) -> Tensor:
    """``(B, N)`` bool: the best ``budget`` items per example, or those above ``threshold``."""
    if (budget is None) == (threshold is None):
        raise MasklabError("give exactly one of a budget and a score threshold")
    if threshold is not None:
        return (torch.sigmoid(scores) >= threshold) & valid
    return top_k(scores, valid, budget_k(budget, valid, gold))


@torch.no_grad()
def router_scores(router: TokenRouter, batch: EvidenceBatch) -> Tensor:
    """``(B, N)`` scores of every item on the CPU (``-inf`` on padding); the router runs on its
    own device."""
    inputs = devices.to((batch.items, batch.query, batch.valid, batch.positions), devices.of(router))
    return router(*inputs).cpu()


@torch.no_grad()
def teacher_answer(teacher, batch: EvidenceBatch, keep: Tensor, mode: str = "delete") -> Tensor:
    """``(B,)`` the teacher's argmax answer from the kept items only (``mode`` "delete": the
    others are dropped from the sequence; "key_bias": masked in the attention bias)."""
    if mode not in MODES:
        raise MasklabError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return answer_logits(teacher, batch, keep, mode).argmax(-1)


@torch.no_grad()
def sparse_answer(
    teacher,
    router: TokenRouter,
    batch: EvidenceBatch,
    budget: Budget | None = 0.1,
    threshold: float | None = None,
    mode: str = "delete",
) -> tuple[Tensor, Tensor]:
    """Route, then answer: ``(answers (B,), keep (B, N) bool)``. The router scores every item,
    ``budget`` (or ``threshold``) picks the kept ones, the teacher reads only those."""
    router.eval()
    if isinstance(budget, str):
        budget = parse_budget(budget)
    scores = router_scores(router, batch)
    keep = keep_mask(scores, batch.valid, None if threshold is not None else budget, threshold, batch.gold)
    return teacher_answer(teacher, batch, keep, mode), keep


def teacher_flops(teacher, n_items: int) -> int:
    """FLOPs of one teacher forward pass over ``n_items`` items (query token included)."""
    return transformer_flops(n_items + 1, teacher.dim, teacher.depth)


# ----------------------------------------------------------------------------- selectors

SELECTORS: Registry["Selector"] = Registry("selector", instantiate=True)
register = SELECTORS.register


@dataclass
class Selector:
    """Scores ``(B, N)`` (higher = keep first) from the batch and, where needed, the teacher."""

    name = "base"

    def score(self, teacher, batch: EvidenceBatch, rng: np.random.Generator) -> Tensor:
        raise NotImplementedError


@register("random")
class RandomSelector(Selector):
    def score(self, teacher, batch, rng):
        return torch.from_numpy(rng.random(batch.valid.shape)).float()


@register("recent")
class RecentSelector(Selector):
    """The most recent items (highest positions), as a sliding window would keep."""

    def score(self, teacher, batch, rng):
        return batch.positions.float()


@dataclass
class AttentionSelector(Selector):
    """The teacher's attention from the query token in a dense pre-fill (SnapKV-style),
    aggregated by ``aggregate`` (see :mod:`masklab.lab.evidence.attention_targets`)."""

    aggregate: str = "layer-mean"

    def score(self, teacher, batch, rng):
        return aggregate_fn(self.aggregate)(attention_maps(teacher, batch))


register("teacher-attention")(AttentionSelector)


@register("oracle-gold")
class GoldSelector(Selector):
    def score(self, teacher, batch, rng):
        return batch.gold.float()


@register("dense")
class DenseSelector(Selector):
    """Every item scores the same; use it with a budget of 1.0 (keep all)."""

    def score(self, teacher, batch, rng):
        return torch.ones(batch.valid.shape)
