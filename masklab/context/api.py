"""``prune(question, context, threshold=...)``: the shape users of context pruners know
(Provence's ``process``), over any router; a list of questions and contexts is one batch.

    from masklab.context import prune
    out = prune("Which option lists every label?", text)            # the default router, its own threshold
    out["pruned_context"], out["scores"], out["compression_rate"]
    outs = prune([q1, q2], [text, text], threshold=0.3)            # questions on one text scored together

Each result is :meth:`Pruned.to_json <masklab.context.router.Pruned.to_json>` (docs/context.md lists its keys).
"""

from __future__ import annotations

from functools import lru_cache

from masklab.context.router import DEFAULT_ROUTER, Request
from masklab.text.selection import AUTO
from masklab.util.errors import MasklabError


@lru_cache(maxsize=4)
def _router(name: str):
    from masklab.context.routers import load_router

    return load_router(name)


def prune(
    question: str | list[str],
    context: str | list[str],
    threshold: float | None = None,
    keep: float | str = AUTO,
    router: str = DEFAULT_ROUTER,
    fill: bool | None = None,
) -> dict | list[dict]:
    """``context`` pruned for ``question``: ``pruned_context`` (the kept units in reading order),
    ``units`` and each one's ``scores``, ``kept`` (unit indices), ``kept_fraction`` and
    ``compression_rate`` (1 - kept fraction, in words: no model's tokenizer is loaded), and the
    rest of :meth:`~masklab.context.router.Pruned.to_json`.
    ``threshold``: keep the units scoring at least it and no other, none where no unit reaches
    it (a router that decides how much);
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
    requests = [Request.of(q, c, keep=keep, threshold=threshold, fill=fill, router=router) for q, c in zip(qs, cs)]
    out = [p.to_json() for p in _router(router).prune_all(requests)]
    return out[0] if single else out
