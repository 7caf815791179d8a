"""``dense``: the cosine similarity of the question's and each unit's sentence embedding
(all-MiniLM-L6-v2 by default, :mod:`masklab.context.embedder`), what LangChain's
``EmbeddingsFilter`` and LlamaIndex's ``SentenceEmbeddingOptimizer`` rank by."""

from __future__ import annotations

from masklab.context.embedder import load_embedder
from masklab.context.router import ROUTERS, Router


@ROUTERS.register("dense")
class Dense(Router):
    """``embedder``: a sentence-transformers model folder (None: the packaged MiniLM). It
    reads no answering model; ``lm`` only counts tokens."""

    use = (
        "any document, above all questions worded unlike their answer: a 22M sentence-embedding model "
        "(docs/context.md: above bm25 on the paraphrased test split, below the pruner); --embedder names another"
    )

    options = ("embedder",)

    def __init__(self, lm=None, embedder: str | None = None) -> None:
        super().__init__(lm)
        self.embedder = load_embedder(embedder)
        self.meta = {"embedder": str(self.embedder.path)}

    def score(self, doc, question):
        return self.embedder.units(doc.units) @ self.embedder.query(question)
