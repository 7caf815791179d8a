"""masklab's routers inside other frameworks' retrieval pipelines (optional extras):

* :mod:`masklab.integrations.langchain`: :class:`MasklabCompressor`, a LangChain
  ``BaseDocumentCompressor`` (extra ``langchain``: ``langchain-core``);
* :mod:`masklab.integrations.llamaindex`: :class:`MasklabPostprocessor`, a LlamaIndex
  ``BaseNodePostprocessor`` (extra ``llamaindex``: ``llama-index-core``).

Both prune the retrieved passages for the query within one budget with
:func:`masklab.context.passages.compress_passages` (:class:`Pruner`): each passage keeps its
best units, in reading order, and a passage that keeps none is dropped.
"""

from __future__ import annotations

from masklab.text.document import UNIT_TOKENS
from masklab.context.passages import DEFAULT_KEEP, PrunedPassages, check_target, compress_passages
from masklab.context.router import DEFAULT_ROUTER
from masklab.text.selection import check_keep
from masklab.util.errors import MasklabError


class Pruner:
    """Router ``router`` (a name, see ``masklab compress --list-routers``) for ``model`` (a
    registered model name, a model directory, a loaded model, or None: words are counted and
    only routers that read no model work), loaded the first time it prunes; one budget of
    ``keep`` of all the passages' tokens or ``target_tokens`` tokens (which wins when both are
    given; neither: keep 0.25; ``keep="auto"``: the router's own val threshold) or, for a router
    that decides how much (``pruner-ctx``, ``pruner``), every unit scoring at least ``threshold``;
    ``embedder``: a sentence-transformers folder for the ``dense`` routers (None: the packaged
    all-MiniLM-L6-v2)."""

    def __init__(self, router: str = DEFAULT_ROUTER, model=None, keep: float | str | None = None,
                 target_tokens: int | None = None, unit_tokens: int = UNIT_TOKENS, embedder: str | None = None,
                 threshold: float | None = None) -> None:
        from masklab.context.routers import ROUTERS, check_embedder

        ROUTERS[router]  # noqa: B018  (unknown router: one clear error now, not at the first query)
        check_embedder(router, embedder, "embedder=")
        self.name, self.model, self.embedder = router, model, embedder
        self.keep = check_keep(DEFAULT_KEEP if keep is None else keep)
        self.target_tokens = None if target_tokens is None else check_target(target_tokens)
        if threshold is not None and target_tokens is not None:
            raise MasklabError("threshold and target_tokens each set the budget: give one")
        if threshold is not None:
            ROUTERS[router].check_range(threshold)  # a router that decides how much, the threshold in its scores' range
        self.threshold = threshold
        if isinstance(unit_tokens, bool) or not isinstance(unit_tokens, int) or unit_tokens < 1:
            raise MasklabError(f"unit_tokens must be a whole number >= 1, got {unit_tokens!r}")
        self.unit_tokens = unit_tokens
        self._router = None

    @property
    def router(self):
        if self._router is None:
            from masklab.context.routers import load_router

            self._router = load_router(self.name, self.model, embedder=self.embedder)
        return self._router

    def prune(self, texts: list[str], query: str) -> PrunedPassages:
        return compress_passages(list(texts), query, self.router, keep=self.keep, target_tokens=self.target_tokens,
                                 unit_tokens=self.unit_tokens, threshold=self.threshold)

    def kept(self, texts: list[str], query: str) -> list[tuple[int, str, dict]]:
        """``(index, kept text, counts)`` of each passage that keeps anything, in the given
        order; passages of only whitespace are left out of the pruning and dropped."""
        live = [i for i, t in enumerate(texts) if t.strip()]
        if not live:
            return []
        out = self.prune([texts[i] for i in live], query).to_json()
        return [(live[p["index"]], p["text"], {"rank": p["rank"], "tokens": p["tokens"], "kept_tokens": p["kept_tokens"],
                                                "router": out["router"]})
                for p in out["passages"] if p["kept_units"]]
