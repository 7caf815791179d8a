"""Each unit read in its passage, and a second hop: the features of the ``pruner-passage`` router.

``pruner-ctx`` (:mod:`masklab.context.contextual`) reads a unit beside its neighbours but not in
its passage: "It was released two years later" is scored without the title that says what "it" is,
and nothing follows the name the best unit gives. This module adds, for each unit:

* **its groups**: the blank-line paragraph and the section (the text under one heading; in several
  passages, never more than one passage) it belongs to (:meth:`Document.groups
  <masklab.text.document.Document.groups>`), each read two ways: the best pruner score inside it
  (embedding) and the BM25 score of its whole text (names match exactly, and the heading is part of it);
* **a second hop** (multi-hop dense retrieval's recipe): the question followed by the text of the best
  unit, whole, embedded again (``q_hop``) and as a BM25 query, so a unit or passage that explains what
  the best unit names scores high though it shares no word with the question. The hop is not switched
  on for every question: its scores are features, and the head learns when they count.

Every feature is standardised within the document (z-scores), so a head trained on one kind of
document reads another. Shapes: ``units`` (N, D) unit-length embeddings, ``q`` and ``q_hop`` (D,);
:func:`passage_features` -> ``s`` (N,), ``x`` (N, F) with F = ``len(FEATURES)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from masklab.context.contextual import FEATURES as UNIT_FEATURES
from masklab.context.contextual import neighbourhood
from masklab.text.document import Document

LEVELS = ("paragraph", "section")
GROUP_FEATURES = ("z_max", "z_hop_max", "bm25", "bm25_hop")
UNIT_MORE = ("z_hop", "unit_bm25", "unit_bm25_hop", "with_best")  # the unit's BM25, and the hop's scores
FEATURES = (
    *UNIT_FEATURES,
    *UNIT_MORE,
    *(f"{level}_{f}" for level in LEVELS for f in GROUP_FEATURES),
)


# what each head reads: every feature, or with some zeroed (a head trained so reads them zeroed at use too)
VARIANTS = {
    "two-hop": (),
    "one-hop": tuple(i for i, f in enumerate(FEATURES) if "hop" in f or f == "with_best"),  # no second hop
    "unit": tuple(range(len(UNIT_FEATURES), len(FEATURES))),  # pruner-ctx's features alone (the control)
}


def masked(x: Tensor, variant: str) -> Tensor:
    """``(N, F)`` features ``x`` with the columns ``variant`` does not read set to zero."""
    columns = VARIANTS[variant]
    if not columns:
        return x
    x = x.clone()
    x[:, list(columns)] = 0.0
    return x


def zscore(v: Tensor) -> Tensor:
    """``v`` standardised (zeros where it does not vary)."""
    if v.numel() < 2:
        return torch.zeros_like(v)
    sd = v.std()
    return (v - v.mean()) / sd if float(sd) > 1e-6 else torch.zeros_like(v)


def bm25(texts: list[str], queries: list[str]) -> Tensor:
    """``(Q, T)`` Okapi BM25 (the ``bm25s`` library: lower-cased words, English stop words out, idf over
    ``texts``) of each query against each text; zeros where a query or every text has no word."""
    import bm25s

    docs = bm25s.tokenize(texts, return_ids=False, stopwords="en", show_progress=False)
    out = torch.zeros(len(queries), len(texts))
    if not any(docs):
        return out
    index = bm25s.BM25()
    index.index(docs, show_progress=False)
    for i, q in enumerate(bm25s.tokenize(queries, return_ids=False, stopwords="en", show_progress=False)):
        if q:
            out[i] = torch.from_numpy(index.get_scores(q)).float()
    return out


def hop_query(question: str, doc: Document, s: Tensor) -> str:
    """The second hop's query: ``question`` followed by the whole text of its best unit by ``s``."""
    return f"{question} {doc.units[int(s.argmax())]}"


def passage_features(doc: Document, units: Tensor, q: Tensor, q_hop: Tensor, question: str) -> tuple[Tensor, Tensor]:
    """``(s (N,), x (N, F))``: the pruner's scores and each unit's features in the order of
    :data:`FEATURES` (module docstring): :func:`~masklab.context.contextual.neighbourhood`'s, then
    the unit's BM25 and the hop's (:data:`UNIT_MORE`), then each level's group features. ``q_hop`` is
    the embedding of :func:`hop_query`."""
    s, x = neighbourhood(units, q)
    n = len(doc.units)
    s_hop = units @ q_hop
    z, z_hop = zscore(s), zscore(s_hop)
    best = int(s.argmax())
    hop = hop_query(question, doc, s)
    unit_bm = bm25(doc.units, [question, hop])
    cols = [z_hop, zscore(unit_bm[0]), zscore(unit_bm[1])]
    sections = torch.tensor(doc.groups("section"))
    cols.append((sections == sections[best]).float())
    for level in LEVELS:
        g = torch.tensor(doc.groups(level))
        k = int(g.max()) + 1
        z_max = torch.full((k,), -1e9).scatter_reduce(0, g, z, "amax")
        zh_max = torch.full((k,), -1e9).scatter_reduce(0, g, z_hop, "amax")
        texts = ["" for _ in range(k)]
        for i in range(n):
            texts[int(g[i])] += " " + doc.units[i]
        group_bm = bm25(texts, [question, hop])
        cols += [z_max[g], zh_max[g], zscore(group_bm[0])[g], zscore(group_bm[1])[g]]
    return s, torch.cat([x, torch.stack(cols, dim=1)], dim=1)


def together(doc: Document, scores: Tensor) -> Tensor:
    """``(N,)`` ``scores`` with the pieces of one sentence that the unit-length cut split all given their best
    piece's score, so they rank, and are kept, together."""
    g = torch.tensor(doc.groups("sentence"))
    return torch.full((int(g.max()) + 1,), -torch.inf).scatter_reduce(0, g, scores, "amax")[g]
