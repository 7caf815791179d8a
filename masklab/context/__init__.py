"""Prune a context for a question before a model reads it.

    from masklab.context import Request, load_router
    router = load_router("bm25")                              # or any name of ROUTERS (--list-routers)
    pruned = router.prune(Request("Who approved the budget?", [text], fraction=0.25))
    pruned.text, pruned.kept, pruned.scores, pruned.kept_fraction, pruned.seconds, pruned.to_json()

* :mod:`~masklab.text.document`: :class:`Document` (units, gold, spans) and :func:`segment`;
* :mod:`~masklab.context.router`: :class:`Router` (override ``score``; ``prune(request)``),
  :data:`ROUTERS`, :class:`Request` (a question, its passages, one budget), checked once
  against what the router declares, and :class:`Pruned`, the one result;
* :mod:`~masklab.text.selection`: :func:`select`, the one rule that keeps units within a budget;
* :mod:`~masklab.context.routers`: one file per router (:data:`ROUTERS` names them all, as
  ``masklab compress --list-routers`` prints them) and :func:`load_router`;
* :mod:`~masklab.context.presses`: kvpress's presses (``PRESSES``);
* :mod:`~masklab.context.routers.features`: the trained routers' features and files;
* :mod:`~masklab.context.press`: a router as a kvpress press (prune before prefill);
* :mod:`~masklab.context.answer`: answer from a pruned context, timed;
* :mod:`~masklab.context.api`: :func:`prune` (question, context, threshold) as Provence's users
  know it, batched over lists.
"""

from __future__ import annotations

import importlib

# each name and the module that defines it, imported on first use (PEP 562): importing a submodule
# (``masklab compress`` imports masklab.context.cli) loads no router, no torch
_WHERE = {
    "Document": "masklab.text.document",
    "segment": "masklab.text.document",
    "select": "masklab.text.selection",
    "Router": "masklab.context.router",
    "ROUTERS": "masklab.context.router",
    "Pruned": "masklab.context.router",
    "Request": "masklab.context.router",
    "load_router": "masklab.context.routers",
    "prune": "masklab.context.api",
}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
