"""``prune(question, context, threshold=...)``: the shape users of context pruners know
(Provence's ``process``), over any router; a list of questions and contexts is one batch.

    from masklab.context import prune
    out = prune("Which option lists every label?", text)            # the default router, its own threshold
    out["pruned_context"], out["scores"], out["compression_rate"]
    outs = prune([q1, q2], [text, text], threshold=0.3)            # questions on one text scored together
"""

from __future__ import annotations

from functools import lru_cache

from masklab.context.router import DEFAULT_ROUTER, Pruned
from masklab.util.errors import MasklabError
from masklab.text.inputs import check_context
from masklab.text.selection import AUTO


@lru_cache(maxsize=4)
def _router(name: str):
    from masklab.context.routers import load_router

    return load_router(name)


def result(p: Pruned) -> dict:
    """One pruned context as :func:`prune` returns it."""
    return {"pruned_context": p.text, "units": p.doc.units, "scores": p.scores, "kept": p.kept,
            "kept_fraction": p.kept_fraction, "compression_rate": 1 - p.kept_fraction, "router": p.router,
            "seconds": p.seconds}


def prune(question: str | list[str], context: str | list[str], threshold: float | None = None,
          keep: float | str = AUTO, router: str = DEFAULT_ROUTER, fill: bool | None = None) -> dict | list[dict]:
    """``context`` pruned for ``question``: ``pruned_context`` (the kept units in reading order),
    ``units`` and each one's ``scores``, ``kept`` (unit indices), ``kept_fraction`` and
    ``compression_rate`` (1 - kept fraction, in words: no model's tokenizer is loaded).
    ``threshold``: keep every unit scoring at least it (a router that decides how much);
    else ``keep``: a fraction of the words, or ``auto`` (the router's threshold chosen on val).
    Lists of questions and contexts (the same length) give a list, the questions on one
    context scored in one batch."""
    single = isinstance(question, str)
    if single != isinstance(context, str):
        raise MasklabError("give one question and one context, or a list of each (the same length)")
    qs, cs = ([question], [context]) if single else (list(question), list(context))
    if len(qs) != len(cs):
        raise MasklabError(f"{len(qs)} questions and {len(cs)} contexts: give one context per question")
    for c in cs:
        if not isinstance(c, str):
            raise MasklabError(f"a context must be text, got {type(c).__name__}")
        check_context(c)
    out = [result(p) for p in _router(router).prune_many(list(zip(qs, cs)), keep=keep, fill=fill, threshold=threshold)]
    return out[0] if single else out
