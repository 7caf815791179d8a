"""A LlamaIndex node postprocessor that prunes retrieved nodes with a masklab router.

    from llama_index.core.schema import NodeWithScore, TextNode
    from masklab.integrations.llamaindex import MasklabPostprocessor

    post = MasklabPostprocessor(router="bm25", keep=0.3)         # or router="evidence", model="smollm2-135m"
    nodes = post.postprocess_nodes([NodeWithScore(node=TextNode(text=...), score=0.8), ...],
                                   query_str="Who approved the budget?")

As ``index.as_query_engine(node_postprocessors=[post])`` it prunes what the retriever
returns before the LLM reads it. Each node keeps its best units for the query within one
budget over all of them (:class:`masklab.integrations.Adapter`), in reading order: a copy of
the node with the kept text, its score and metadata, and ``metadata["masklab"]`` (``rank``
by its best unit, ``tokens``, ``kept_tokens``, ``router``); a node that keeps nothing is
dropped; the others stay in the order given. Needs the ``llamaindex`` extra
(``llama-index-core``).
"""

from __future__ import annotations

from typing import Any

from masklab.text.document import UNIT_TOKENS
from masklab.util.errors import MasklabError
from masklab.context.router import DEFAULT_ROUTER
from masklab.integrations import Adapter

try:
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
except ImportError:  # pragma: no cover (the extra is missing)
    raise MasklabError(
        "masklab.integrations.llamaindex needs llama-index-core: pip install 'masklab[llamaindex]'"
    ) from None


class MasklabPostprocessor(BaseNodePostprocessor):
    """Prune retrieved nodes for the query with masklab router ``router`` (for ``model`` when
    it reads one), keeping ``keep`` of all their tokens, ``target_tokens`` tokens, or every unit scoring at
    least ``threshold`` (a router that decides how much: one with a score range)."""

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

    @classmethod
    def class_name(cls) -> str:
        return "MasklabPostprocessor"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise MasklabError("MasklabPostprocessor prunes for a query: pass query_str= or query_bundle=")
        texts = [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        out = []
        for i, text, info in self._adapter.kept(texts, query_bundle.query_str):
            node = nodes[i].node.model_copy(deep=True)
            node.set_content(text)
            node.metadata = {**node.metadata, "masklab": info}
            out.append(NodeWithScore(node=node, score=nodes[i].score))
        return out
