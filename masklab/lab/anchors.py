"""Framework anchors for ``masklab realdocs``: LangChain's ``EmbeddingsFilter`` and
LlamaIndex's ``SentenceEmbeddingOptimizer`` run through their own classes, with masklab's
embedder (:func:`masklab.context.embedder.load_embedder`, the packaged all-MiniLM-L6-v2 by
default) on masklab's units: what a user of those frameworks gets today, measured beside the
routers. Not routers (``masklab compress`` does not know them); ``masklab realdocs --routers``
takes their names (:data:`ANCHORS`). Needs the ``anchors`` extra (:data:`INSTALL`).

* ``langchain-embeddingsfilter``: each unit is one LangChain ``Document``;
  ``EmbeddingsFilter(k=len(units), similarity_threshold=None).compress_documents(units,
  question)`` gives every unit's similarity (``doc.state["query_similarity_score"]``), which
  ranks the units (``rank``, ``rr``) and, within each ``--keep`` budget of tokens, picks them as
  masklab's own selection does (:func:`masklab.text.selection.select`). ``default``: the class with
  its documented defaults (``k=20``, no threshold): how many units it returns and whether every
  answering unit is among them.
* ``llamaindex-sentenceoptimizer``: the whole document as one ``TextNode``;
  ``SentenceEmbeddingOptimizer(percentile_cutoff=keep, tokenizer_fn=<masklab's units of the
  text>)`` rewrites the node's text, and the units found in that text are the kept ones. It keeps
  ``int(keep * units)`` units (all of them when that is 0) *and one unit either side of each*
  (its default ``context_before`` / ``context_after`` of 1), so its kept fraction of tokens is
  recorded beside ``kept`` (``kept_fraction``: the distinct units found; ``text_fraction``: the
  text it returns, repeated neighbours included). It exposes no similarities, so it has no rank.
"""

from __future__ import annotations

import time
from functools import lru_cache

from masklab.util.errors import MasklabError

LANGCHAIN, LLAMAINDEX = "langchain-embeddingsfilter", "llamaindex-sentenceoptimizer"
ANCHORS = (LANGCHAIN, LLAMAINDEX)
INSTALL = "pip install 'masklab[anchors]'"
LANGCHAIN_DEFAULT_K = 20  # EmbeddingsFilter.k's documented default
NEEDS = {LANGCHAIN: ("langchain_core", "langchain_classic", "langchain_community"), LLAMAINDEX: ("llama_index.core",)}


def check(names) -> None:
    """One clear error, before any model loads, when an anchor of ``names`` lacks its packages."""
    import importlib

    for name in names:
        for module in NEEDS.get(name, ()):
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise MasklabError(
                    f"the anchor {name} needs {module.split('.')[0].replace('_', '-')} "
                    f"({type(e).__name__}: {e}): {INSTALL}"
                ) from None


def _versions(*dists: str) -> dict[str, str]:
    from importlib.metadata import version

    return {d: version(d) for d in dists}


@lru_cache(maxsize=1)
def _langchain_embeddings_class():
    from langchain_core.embeddings import Embeddings

    class MasklabEmbeddings(Embeddings):
        """LangChain ``Embeddings`` of a masklab :class:`~masklab.context.embedder.Embedder`
        (a document's units are embedded once: the embedder's cache)."""

        def __init__(self, embedder) -> None:
            self.embedder = embedder

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return self.embedder.units(list(texts)).tolist()

        def embed_query(self, text: str) -> list[float]:
            return self.embedder.query(text).tolist()

    return MasklabEmbeddings


@lru_cache(maxsize=1)
def _llamaindex_embedding_class():
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from pydantic import PrivateAttr

    class MasklabEmbedding(BaseEmbedding):
        """A LlamaIndex ``BaseEmbedding`` of a masklab :class:`~masklab.context.embedder.Embedder`."""

        _embedder = PrivateAttr()

        def __init__(self, embedder, **kwargs) -> None:
            super().__init__(model_name=embedder.name, **kwargs)
            self._embedder = embedder

        @classmethod
        def class_name(cls) -> str:
            return "MasklabEmbedding"

        def _get_query_embedding(self, query: str) -> list[float]:
            return self._embedder.query(query).tolist()

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return self._embedder.query(text).tolist()  # one text: not a document for the cache

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return self._embedder.units(list(texts)).tolist()  # a node's sentences: one document

    return MasklabEmbedding


def _covered(kept, gold) -> bool:
    return all(u in kept for g in gold for u in g)


class LangChainAnchor:
    """LangChain's ``EmbeddingsFilter`` over a document's units (module docstring)."""

    name = LANGCHAIN

    def __init__(self, embedder: str | None = None) -> None:
        from masklab.context.embedder import load_embedder

        check([self.name])
        self.embedder = load_embedder(embedder)
        self.embeddings = _langchain_embeddings_class()(self.embedder)
        self.meta = {
            "embedder": str(self.embedder.path),
            **_versions("langchain-core", "langchain-classic", "langchain-community"),
        }

    def compress(self, units: list[str], question: str, k: int | None) -> list[tuple[int, float]]:
        """``(unit index, similarity)`` of what ``EmbeddingsFilter(k=k)`` returns, in its order."""
        from langchain_classic.retrievers.document_compressors.embeddings_filter import EmbeddingsFilter
        from langchain_core.documents import Document

        docs = [Document(page_content=u, metadata={"unit": i}) for i, u in enumerate(units)]
        kwargs = {} if k == LANGCHAIN_DEFAULT_K else {"k": k, "similarity_threshold": None}
        out = EmbeddingsFilter(embeddings=self.embeddings, **kwargs).compress_documents(docs, question)
        return [(d.metadata["unit"], float(d.state["query_similarity_score"])) for d in out]

    def score(self, doc, question: str):
        """Every unit's similarity as ``EmbeddingsFilter`` stores it, ``(N,)`` in unit order."""
        import torch

        got = self.compress(doc.units, question, len(doc.units))
        if sorted(i for i, _ in got) != list(range(len(doc.units))):
            raise MasklabError(f"EmbeddingsFilter(k={len(doc.units)}) returned {len(got)} of {len(doc.units)} units")
        scores = torch.zeros(len(doc.units), dtype=torch.float64)
        for i, s in got:
            scores[i] = s
        return scores

    def default(self, doc, question: str, gold, lengths) -> dict:
        """What ``EmbeddingsFilter`` returns with its documented defaults (``k=20``, no
        threshold): how many units, whether every answering unit is among them, their share
        of the tokens."""
        returned = {i for i, _ in self.compress(doc.units, question, LANGCHAIN_DEFAULT_K)}
        return {
            "k": LANGCHAIN_DEFAULT_K,
            "units": len(returned),
            "kept": _covered(returned, gold),
            "kept_fraction": sum(lengths[i] for i in returned) / sum(lengths),
        }


def units_in(text: str, units: list[str]) -> set[int]:
    """Indices of ``units`` whose text stands in ``text`` as a whole unit (at the start or after
    whitespace, at the end or before whitespace). Longer units are found first and their
    places claimed, so a short unit that only occurs inside a longer kept one is not counted;
    units with the same text are all found together."""
    import re

    by_text: dict[str, list[int]] = {}
    for i, u in enumerate(units):
        by_text.setdefault(u, []).append(i)
    claimed = [False] * len(text)
    found: set[int] = set()
    for u in sorted(by_text, key=len, reverse=True):
        hits = [
            m.start()
            for m in re.finditer(r"(?<!\S)" + re.escape(u) + r"(?!\S)", text)
            if not any(claimed[m.start() : m.start() + len(u)])
        ]
        if hits:
            found.update(by_text[u])
            for a in hits:
                claimed[a : a + len(u)] = [True] * len(u)
    return found


class LlamaIndexAnchor:
    """LlamaIndex's ``SentenceEmbeddingOptimizer`` on a whole document (module docstring).
    ``tokenizer``: the answering model's, which masklab's units are cut with."""

    name = LLAMAINDEX

    def __init__(self, tokenizer=None, embedder: str | None = None) -> None:
        from masklab.context.embedder import load_embedder

        check([self.name])
        self.tokenizer = tokenizer
        self.embedder = load_embedder(embedder)
        self.embed_model = _llamaindex_embedding_class()(self.embedder)
        self._units: dict[str, list[str]] = {}
        self.meta = {"embedder": str(self.embedder.path), **_versions("llama-index-core")}

    def units_of(self, text: str) -> list[str]:
        """The optimizer's ``tokenizer_fn``: masklab's units of ``text`` (:func:`masklab.text.document.segment`)."""
        from masklab.text.document import segment

        if text not in self._units:
            if len(self._units) > 64:
                self._units.clear()
            self._units[text] = segment(text, self.tokenizer).units
        return self._units[text]

    def optimize(self, text: str, question: str, keep: float) -> str:
        """The text ``SentenceEmbeddingOptimizer(percentile_cutoff=keep)`` makes of ``text``."""
        from llama_index.core.postprocessor import SentenceEmbeddingOptimizer
        from llama_index.core.schema import NodeWithScore, TextNode

        opt = SentenceEmbeddingOptimizer(
            embed_model=self.embed_model, percentile_cutoff=keep, tokenizer_fn=self.units_of
        )
        nodes = opt.postprocess_nodes([NodeWithScore(node=TextNode(text=text))], query_str=question)
        return nodes[0].node.get_content()

    def evaluate(self, doc, question: str, gold, lengths, keeps) -> tuple[dict, dict]:
        """``realdocs``'s record (kept, kept_fraction, text_fraction, units per keep; no rank)
        and the text it returned per keep."""
        from masklab.text.document import count_tokens

        source = doc.source if doc.source is not None else doc.context
        self._units.setdefault(source, doc.units)  # what segment() made of it already
        rec: dict = {"router_seconds": 0.0}
        texts = {}
        total = sum(lengths)
        for k in keeps:
            t0 = time.perf_counter()
            text = self.optimize(source, question, k)
            rec["router_seconds"] += time.perf_counter() - t0
            kept = units_in(text, doc.units)
            texts[k] = text
            rec[str(k)] = {
                "kept": _covered(kept, gold),
                "kept_fraction": sum(lengths[i] for i in kept) / total,
                "text_fraction": count_tokens(self.tokenizer, text) / total,
                "units": len(kept),
                "top": int(k * len(doc.units)),
            }
        return rec, texts


def load_anchor(name: str, lm=None, embedder: str | None = None):
    """The anchor ``name`` for answering model ``lm`` (its tokenizer cuts the units)."""
    if name == LANGCHAIN:
        return LangChainAnchor(embedder)
    if name == LLAMAINDEX:
        return LlamaIndexAnchor(getattr(lm, "tokenizer", None), embedder)
    raise MasklabError(f"unknown anchor {name!r}; anchors: {', '.join(ANCHORS)}")
