"""The one selection rule: which units a router keeps within a token budget."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from masklab.errors import MasklabError


def check_keep(keep: float) -> float:
    """``keep`` must be a fraction in (0, 1]."""
    if not 0 < keep <= 1:
        raise MasklabError(f"keep must be a fraction in (0, 1], got {keep}")
    return keep


def select(scores: Tensor, lengths: Sequence[int], keep: float, fill: bool = True, limit: int | None = None) -> list[int]:
    """Indices (ascending) of the units kept, from ``scores (N,)`` and token ``lengths (N,)``.

    Highest score first (ties: the earlier unit), each unit while the kept tokens stay within
    ``keep`` x the total (and within ``limit`` tokens, if given); a unit that would overflow
    is skipped and a smaller later one may still fit. The top unit is always kept. Unless
    ``fill``, selection stops at the first unit scored below 0 (a trained router's decision
    boundary: "not evidence"), so ``keep`` is then a cap."""
    check_keep(keep)
    if len(lengths) != scores.shape[0]:
        raise MasklabError(f"{scores.shape[0]} scores for {len(lengths)} units")
    budget = keep * sum(lengths)
    if limit is not None:
        budget = min(budget, limit)
    kept: list[int] = []
    used = 0
    for i in torch.argsort(scores, descending=True, stable=True).tolist():
        if kept and not fill and scores[i] < 0:
            break
        if not kept or used + lengths[i] <= budget:
            kept.append(i)
            used += lengths[i]
    return sorted(kept)
