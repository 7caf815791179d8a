"""A LangChain document compressor that prunes retrieved documents with a masklab router.

    from langchain_core.documents import Document
    from masklab.integrations.langchain import MasklabCompressor

    compressor = MasklabCompressor(router="bm25", keep=0.3)     # or router="evidence", model="smollm2-135m"
    docs = compressor.compress_documents([Document(page_content=...), ...], "Who approved the budget?")

With ``langchain``'s ``ContextualCompressionRetriever(base_compressor=compressor,
base_retriever=...)`` it prunes what a retriever returns. Each document keeps its best
units for the query within one budget over all of them (:class:`masklab.integrations.Adapter`),
in reading order, with its metadata and ``metadata["masklab"]`` (``rank`` of the document by
its best unit, ``tokens``, ``kept_tokens``, ``router``); a document that keeps nothing is
dropped; the others stay in the order given. Needs the ``langchain`` extra (``langchain-core``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from masklab.text.document import UNIT_TOKENS
from masklab.util.errors import MasklabError
from masklab.context.router import DEFAULT_ROUTER
from masklab.integrations import Adapter

try:
    from langchain_core.documents import BaseDocumentCompressor, Document
except ImportError:  # pragma: no cover (the extra is missing)
    raise MasklabError(
        "masklab.integrations.langchain needs langchain-core: pip install 'masklab[langchain]'"
    ) from None
from pydantic import ConfigDict, PrivateAttr


class MasklabCompressor(BaseDocumentCompressor):
    """Prune retrieved documents for the query with masklab router ``router`` (for ``model``
    when it reads one), keeping ``keep`` of all their tokens, ``target_tokens`` tokens, or every unit scoring at
    least ``threshold`` (a router that decides how much: one with a score range)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    router: str = DEFAULT_ROUTER
    model: Any = None
    keep: float | str | None = None  # a fraction of the tokens, or "auto": a deciding router's val threshold
    target_tokens: int | None = None
    threshold: float | None = None  # a router that decides how much: keep every unit scoring at least it
    unit_tokens: int = UNIT_TOKENS
    embedder: str | None = None  # dense, bm25+dense: a sentence-transformers folder (None: all-MiniLM-L6-v2)
    _adapter: Adapter = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._adapter = Adapter(
            self.router, self.model, self.keep, self.target_tokens, self.unit_tokens, self.embedder, self.threshold
        )

    def compress_documents(self, documents: Sequence[Document], query: str, callbacks=None) -> Sequence[Document]:
        kept = self._adapter.kept([d.page_content for d in documents], query)
        return [
            Document(page_content=text, metadata={**documents[i].metadata, "masklab": info}, id=documents[i].id)
            for i, text, info in kept
        ]
