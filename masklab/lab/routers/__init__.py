"""Research routers: the controls and references the lab evaluates beside the product's routers.

The product's registry (:data:`masklab.context.router.ROUTERS`, what ``masklab compress
--router`` and ``--list-routers`` offer) holds only routers for users' documents. The lab's
own registries hold the rest:

* :data:`LAB_ROUTERS`: routers (each a :class:`~masklab.context.router.Router` ranking units
  through ``score``, like the product's): ``attention``, ``bm25+attention``,
  ``pruner-attention`` and ``pruner-marks`` (the product's models trained on other labels:
  the controls), ``cross`` (the cross-encoder pruner, :mod:`masklab.lab.routers.cross`: it left the
  product, below ``pruner-ctx`` on val), ``oracle-gold`` (a generated task's gold units first: a reference) and
  ``NAME+hop2`` (a product router with a second hop, :mod:`masklab.lab.routers.hops`);
* :data:`REWRITERS`: compressors that rewrite the text instead of ranking units
  (``longllmlingua``, the peer), each a :class:`Rewriter`.

:func:`load_any` builds any of them, or a product router, by name (``masklab realdocs
--routers`` and the ``longctx`` study take every name of :func:`names`).
"""

from __future__ import annotations

from masklab.context.routers import ROUTERS
from masklab.context.routers import load_router
from masklab.lab.routers import controls, cross, hops, longllmlingua, oracle  # noqa: F401  (they register themselves)
from masklab.lab.routers.registry import LAB_ROUTERS, REWRITERS, Rewriter  # noqa: F401  (the lab's router API)


def names() -> list[str]:
    """Every router the lab can run: the product's, then the lab's routers and rewriters."""
    return [*ROUTERS, *LAB_ROUTERS, *REWRITERS]


def check(name: str) -> None:
    """An unknown router name: one error listing every name."""
    if name not in names():
        from masklab.util.errors import unknown

        raise unknown("router", name, names())


def factory(name: str):
    """The registered class of router (or rewriter) ``name``, whichever registry holds it."""
    check(name)
    return next(reg[name] for reg in (ROUTERS, LAB_ROUTERS, REWRITERS) if name in reg)


def load_any(name: str, model=None, **options):
    """The router (or rewriter) ``name``, as :func:`masklab.context.routers.load_router`
    builds a product one (``model``: a name, a folder, a loaded model or None)."""
    check(name)
    registry = next(reg for reg in (ROUTERS, LAB_ROUTERS, REWRITERS) if name in reg)
    return load_router(name, model, registry=registry, **options)


def takes(name: str, option: str) -> bool:
    """Whether router ``name`` declares ``option`` (``score_range``: whether it decides how much)."""
    cls = factory(name)
    if option == "score_range":
        return getattr(cls, "score_range", None) is not None
    return option in getattr(cls, "options", ())
