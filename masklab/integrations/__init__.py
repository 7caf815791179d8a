"""masklab's routers inside other frameworks' retrieval pipelines (optional extras):

* :mod:`masklab.integrations.langchain`: :class:`MasklabCompressor`, a LangChain
  ``BaseDocumentCompressor`` (extra ``langchain``: ``langchain-core``);
* :mod:`masklab.integrations.llamaindex`: :class:`MasklabPostprocessor`, a LlamaIndex
  ``BaseNodePostprocessor`` (extra ``llamaindex``: ``llama-index-core``).

Both build one :class:`~masklab.context.router.Request` over the retrieved passages (one
budget for all of them) and render the :class:`~masklab.context.router.Pruned` result
(:class:`Adapter`): each passage keeps its best units, in reading order, and a passage that
keeps none is dropped.
"""

from __future__ import annotations

from masklab.context.router import DEFAULT_ROUTER, Request
from masklab.text.document import UNIT_TOKENS


class Adapter:
    """Router ``router`` (a name, see ``masklab compress --list-routers``) for ``model`` (a
    registered model name, a model directory, a loaded model, or None: words are counted and
    only routers that read no model work), loaded the first time it prunes; one budget of
    ``keep`` of all the passages' tokens or ``target_tokens`` tokens (which wins when both are
    given; neither: keep 0.25; ``keep="auto"``: the router's own val threshold) or, for a router
    that decides how much (one with a score range: ``masklab compress --list-routers``), every unit
    scoring at least ``threshold``;
    ``embedder``: a sentence-transformers folder for ``dense`` and ``bm25+dense`` (None: the packaged
    all-MiniLM-L6-v2). The settings are checked at once, as one request on a stand-in passage."""

    def __init__(
        self,
        router: str = DEFAULT_ROUTER,
        model=None,
        keep: float | str | None = None,
        target_tokens: int | None = None,
        unit_tokens: int = UNIT_TOKENS,
        embedder: str | None = None,
        threshold: float | None = None,
    ) -> None:
        self.model = model
        self.request = Request.of(
            "?",
            ["(the retrieved passages)"],
            keep=keep,
            target_tokens=target_tokens,
            threshold=threshold,
            unit_tokens=unit_tokens,
            router=router,
            options={"embedder": embedder},
        )
        self._router = None

    @property
    def router(self):
        if self._router is None:
            from masklab.context.router import router_class, router_options
            from masklab.context.routers import load_router

            req = self.request
            self._router = load_router(req.router, self.model, **router_options(router_class(req.router), req.options))
        return self._router

    def kept(self, texts: list[str], query: str) -> list[tuple[int, str, dict]]:
        """``(index, kept text, counts)`` of each passage that keeps anything, in the given
        order; passages of only whitespace are left out of the pruning and dropped."""
        live = [i for i, t in enumerate(texts) if t.strip()]
        if not live:
            return []
        out = self.router.prune(self.request.with_(question=query, passages=[texts[i] for i in live])).to_json()
        return [
            (
                live[p["index"]],
                p["text"],
                {"rank": p["rank"], "tokens": p["tokens"], "kept_tokens": p["kept_tokens"], "router": out["router"]},
            )
            for p in out["passages"]
            if p["kept_units"]
        ]
