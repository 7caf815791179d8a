"""The one selection rule: which units a router keeps within a token budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from masklab.util.errors import MasklabError

if TYPE_CHECKING:  # the scores are tensors; parsing --keep needs no torch
    from torch import Tensor


AUTO = "auto"  # keep "auto": the router decides how much (a pruner's score threshold, chosen on val)
KEEP_RULES = ("threshold", "relative")  # how a router's keep-auto value cuts: a score, or a share of the best score


def check_keep(keep: float | str) -> float | str:
    """``keep`` must be a fraction in (0, 1], or :data:`AUTO`."""
    if keep == AUTO:
        return keep
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep <= 1:
        raise MasklabError(f'keep must be a fraction in (0, 1] or "auto", got {keep!r}')
    return keep


def parse_keep(text: str) -> float | str:
    """A ``--keep`` value: ``auto`` or a number."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return float(text)
    except ValueError:
        raise MasklabError(f"--keep takes a fraction in (0, 1] or auto, got {text!r}") from None


def around_top(scores: Tensor, context: int, within: int | None = None) -> list[int]:
    """The units within ``context`` places of the best unit (ties: the earlier), nearest first and
    the next before the previous; ``within``: only among the first ``within`` units."""
    n = scores.shape[0] if within is None else within
    top = int(scores.argsort(descending=True, stable=True)[0]) if scores.numel() else 0
    return [top + d for k in range(1, context + 1) for d in (k, -k) if 0 <= top + d < n]


def auto_fraction(
    scores: Tensor,
    lengths: Sequence[int],
    threshold: float,
    rule: str = "threshold",
    context: int = 0,
    within: int | None = None,
) -> float:
    """The share of the tokens in the units scoring at least ``threshold`` (``rule="relative"``:
    at least ``threshold`` times the best unit's score, so more units are kept where no unit
    stands out; the top unit and the ``context`` units on each side of it always count, as
    :func:`select` has them): the fraction :func:`select` keeps for ``keep="auto"``."""
    if rule not in KEEP_RULES:
        raise MasklabError(f"unknown keep rule {rule!r}; choose from {', '.join(KEEP_RULES)}")
    above = scores >= (threshold * float(scores.max()) if rule == "relative" else threshold)
    above[int(scores.argsort(descending=True, stable=True)[0])] = True
    above[around_top(scores, context, within)] = True
    return sum(n for n, a in zip(lengths, above.tolist()) if a) / max(1, sum(lengths))


def select(
    scores: Tensor,
    lengths: Sequence[int],
    keep: float,
    fill: bool = True,
    limit: int | None = None,
    context: int = 0,
    within: int | None = None,
) -> list[int]:
    """Indices (ascending) of the units kept, from ``scores (N,)`` and token ``lengths (N,)``.

    Highest score first (ties: the earlier unit), each unit while the kept tokens stay within
    ``keep`` x the total (and within ``limit`` tokens, if given); a unit that would overflow
    is skipped and a smaller later one may still fit. The top unit is always kept, and the
    ``context`` units on each side of it come right after it (:func:`around_top`; ``within``:
    the top unit's document is the first ``within`` units), before the next best: the sentence
    that completes or heads the best one. Unless ``fill``, selection stops at the first unit
    scored below 0 (a trained router's decision boundary: "not evidence"), so ``keep`` is then
    a cap."""
    check_keep(keep)
    if len(lengths) != scores.shape[0]:
        raise MasklabError(f"{scores.shape[0]} scores for {len(lengths)} units")
    budget = keep * sum(lengths)
    if limit is not None:
        budget = min(budget, limit)
    kept: list[int] = []
    used = 0
    order = scores.argsort(descending=True, stable=True).tolist()
    beside = around_top(scores, context, within)
    near = set(beside)
    if near:
        order = order[:1] + beside + [i for i in order[1:] if i not in near]
    for i in order:
        if kept and not fill and scores[i] < 0 and i not in near:
            break
        if not kept or used + lengths[i] <= budget:
            kept.append(i)
            used += lengths[i]
    return sorted(kept)
