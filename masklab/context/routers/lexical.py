"""``lexical``: the share of the question's words a unit contains (the floor a trained router must beat)."""

from __future__ import annotations

import re

import torch

from masklab.context.router import ROUTERS, Router


def words(text: str) -> set[str]:
    """Distinct lower-cased words of 3+ letters (hyphenated keys whole), and numbers."""
    return {w for w in re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", text.lower()) if len(w) > 2}


def question_overlap(units: list[str], question: str) -> list[float]:
    """Per unit: the share of the question's distinct words (:func:`words`) it contains."""
    q = words(question)
    return [len(words(u) & q) / max(1, len(q)) for u in units]


@ROUTERS.register("lexical")
class Lexical(Router):
    """Units ranked by how many of the question's words they contain (ties: the earlier unit)."""

    use = "a baseline: the share of the question's words in each unit"

    def score(self, doc, question):
        return torch.tensor(question_overlap(doc.units, question), dtype=torch.float32)
