"""Every product router: importing this package registers them in
:data:`masklab.context.router.ROUTERS` (one file each), and :func:`load_router` builds one
by name. The lab's controls and references register in :mod:`masklab.lab.routers`.

Every router ranks a document's units through one method, ``score``; what a router
accepts besides a model is declared on its class (``reads_model``, ``options``,
``score_range``: :class:`~masklab.context.router.Router`), which every caller reads."""

from __future__ import annotations

from masklab.context.router import ROUTERS, Router
from masklab.context.routers import bm25, dense, fused, lexical, passage, pruner, trained  # noqa: F401
from masklab.util.registry import Registry


def load_router(name: str, model=None, registry: Registry | None = None, **options) -> Router:
    """The router ``name`` of :data:`ROUTERS` (``lexical``, ``bm25``, ``dense``, ``pruner``,
    ``evidence``, ...; a kvpress press is no router: :data:`masklab.context.presses.PRESSES`
    builds those, and its name here is refused as an unknown router) for ``model``: a
    registered model name, a model directory, a loaded
    :class:`~masklab.pretrained.models.LoadedModel`, or None (routers that read no model then
    count words). ``registry``: another registry to build from (the lab's,
    :mod:`masklab.lab.routers`). ``options`` go to the router where its class declares them
    (``path=`` a trained file, ``embedder=`` a sentence-transformers folder, ``int8=``, ...;
    None and False are not given; one the router does not take is refused)."""
    from masklab.context.router import router_options

    factory = (ROUTERS if registry is None else registry)[name]
    kwargs = router_options(factory, options)
    lm = model
    if isinstance(model, str):
        from masklab.pretrained.models import check_models, load

        check_models([model])
        lm = load(model)
    return factory(lm=lm, **kwargs)
