"""``pruner``: the sentence-embedding model trained on causal labels of real documents
(:mod:`masklab.context.pruner`); the same model trained on other labels (``labels``) is the
lab's control (:mod:`masklab.lab.routers.controls`)."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from masklab.context.router import ROUTERS, Router

WEIGHTS = Path(__file__).resolve().parent.parent / "weights" / "pruner"


def shipped_digest() -> str:
    """12 hex digits of sha256 over the shipped pruners' weights: what names them in a run's
    settings, so shipping new weights redoes the runs."""
    h = hashlib.sha256()
    for path in sorted(WEIGHTS.glob("*.safetensors")):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


@lru_cache(maxsize=4)
def _load(path: str):
    from masklab.context.pruner import load_pruner

    return load_pruner(Path(path))


@ROUTERS.register("pruner")
class Pruner(Router):
    """``path``: a pruner file (``masklab train-router --docs``; None: the shipped one of these labels)."""

    use = ("the default, any document: MiniLM fine-tuned (LoRA) on causal labels of real documents, above dense and "
           "bm25+dense on both real-document test splits; --keep auto decides how much; train-router --docs trains yours")
    labels = "causal"

    def __init__(self, lm=None, path: str | Path | None = None) -> None:
        super().__init__(lm)
        self.path = Path(path) if path is not None else WEIGHTS / f"{self.labels}.safetensors"
        self.model, self.meta = _load(str(self.path))
        self.keep_auto = self.meta.get("keep_auto")  # the score from which --keep auto keeps a unit

    def score(self, doc, question):
        return self.model.rank(question, doc.units)
