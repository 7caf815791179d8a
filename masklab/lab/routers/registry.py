"""The lab's router registries and the rewriter base (:mod:`masklab.lab.routers`)."""

from __future__ import annotations

from masklab.context.router import Pruned, Request, Router
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


def prune_one(
    router: Router | Rewriter,
    doc: Document,
    question: str,
    keep: float | str,
    fill: bool | None = None,
    limit: int | None = None,
    threshold: float | None = None,
) -> Pruned:
    """The lab's shorthand: ``router``'s :meth:`~masklab.context.router.Router.prune` of ``doc``
    (already cut) for ``question`` within ``keep`` of its tokens (or ``threshold``) and ``limit``
    tokens; a :class:`Rewriter`, which ranks no units, rewrites it through its own ``choose``."""
    if isinstance(router, Rewriter):
        return router.choose(doc, question, keep, fill, limit)
    return router.prune(
        Request.of(question, [doc], keep=keep, threshold=threshold, fill=fill, cap=limit, router=type(router))
    )
