"""The lab's router registries and the rewriter base (:mod:`masklab.lab.routers`)."""

from __future__ import annotations

from masklab.context.router import Pruned
from masklab.text.document import Document
from masklab.util.errors import MasklabError
from masklab.util.registry import Registry

LAB_ROUTERS: Registry = Registry("router")
REWRITERS: Registry = Registry("router")


class Rewriter:
    """A compressor that rewrites a document's text for a question (it ranks no units):
    :meth:`choose` returns a :class:`~masklab.context.router.Pruned` with ``compressed`` set."""

    name = ""
    reads_model = False
    use = ""

    def __init__(self, lm=None) -> None:
        if self.reads_model and lm is None:
            raise MasklabError(f"the {self.name} router reads a language model: give one")
        self.lm = lm
        self.notes: list[str] = []

    @property
    def tokenizer(self):
        return None if self.lm is None else self.lm.tokenizer

    def choose(
        self, doc: Document, question: str, keep: float, fill: bool | None = None, limit: int | None = None
    ) -> Pruned:
        raise NotImplementedError
