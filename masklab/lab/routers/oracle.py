"""``oracle-gold``: the gold units of a generated task first, then random others (an evaluation reference)."""

from __future__ import annotations

import random

import torch

from masklab.context.router import Router
from masklab.lab.routers.registry import LAB_ROUTERS
from masklab.util.errors import MasklabError


@LAB_ROUTERS.register("oracle-gold")
class OracleGold(Router):
    """Gold units score 2, the others a seeded random order in [0, 1): with ``fill`` the
    budget is filled with random units (``seed`` fixes which)."""

    def __init__(self, lm=None, seed: int = 0) -> None:
        super().__init__(lm)
        self.seed = seed

    def score(self, doc, question):
        if not doc.gold:
            raise MasklabError("the oracle-gold router needs a document with gold units (a generated task)")
        others = [i for i in range(len(doc.units)) if i not in set(doc.gold)]
        random.Random(self.seed).shuffle(others)
        s = torch.full((len(doc.units),), 2.0)
        for rank, i in enumerate(others):
            s[i] = 1 - (rank + 1) / (len(others) + 1)
        return s
