"""``bm25``: Okapi BM25 (the ``bm25s`` library) of the question against the document's units."""

from __future__ import annotations

import torch

from masklab.context.router import ROUTERS, Router


@ROUTERS.register("bm25")
class BM25(Router):
    """Each unit is a BM25 document (lower-cased words, English stop words removed; idf over
    this document's units); the question is the query."""

    use = (
        "where no embedder can be installed, or the answer repeats the question's words (docs/context.md: "
        "below dense on paraphrased questions)"
    )

    def score(self, doc, question):
        import bm25s

        units = bm25s.tokenize(doc.units, return_ids=False, stopwords="en", show_progress=False)
        query = bm25s.tokenize(question, return_ids=False, stopwords="en", show_progress=False)[0]
        if not query or not any(units):
            return torch.zeros(len(doc.units))
        index = bm25s.BM25()
        index.index(units, show_progress=False)
        return torch.from_numpy(index.get_scores(query)).float()
