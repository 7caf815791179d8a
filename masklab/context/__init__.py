"""Prune a context for a question before a model reads it.

    from masklab.context import load_router
    router = load_router("bm25")                              # or "lexical", "evidence", ... (ROUTERS)
    pruned = router.prune(text, "Who approved the budget?", keep=0.25)
    pruned.text, pruned.kept, pruned.scores, pruned.kept_fraction, pruned.seconds

* :mod:`~masklab.text.document`: :class:`Document` (units, gold, spans) and :func:`segment`;
* :mod:`~masklab.context.passages`: :func:`compress_passages`, several passages pruned within
  one budget (``keep`` or ``target_tokens``) into a :class:`PrunedPassages`;
* :mod:`~masklab.text.selection`: :func:`select`, the one rule that keeps units within a budget;
* :mod:`~masklab.context.router`: :class:`Router` (override ``score``), :data:`ROUTERS`,
  :func:`load_router`, :class:`Pruned`;
* :mod:`~masklab.context.routers`: one file per router (``lexical``, ``bm25``, ``dense``,
  ``pruner``, the trained ``evidence`` and the fused ``bm25+...``);
* :mod:`~masklab.context.presses`: kvpress's presses (``PRESSES``);
* :mod:`~masklab.context.routers.features`: the trained routers' features and files;
* :mod:`~masklab.context.press`: a router as a kvpress press (prune before prefill);
* :mod:`~masklab.context.answer`: answer from a pruned context, timed;
* :mod:`~masklab.context.api`: :func:`prune` (question, context, threshold) as Provence's users
  know it, batched over lists.
"""

from masklab.text.document import Document, segment
from masklab.context.passages import PrunedPassages, compress_passages
from masklab.context.router import ROUTERS, Pruned, Router
from masklab.context.routers import load_router
from masklab.context.api import prune
from masklab.text.selection import select

__all__ = ["Document", "segment", "select", "Router", "ROUTERS", "Pruned", "load_router", "compress_passages",
           "PrunedPassages", "prune"]
