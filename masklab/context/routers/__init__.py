"""Every product router: importing this package registers them in
:data:`masklab.context.router.ROUTERS` (one file each), and :func:`load_router` builds one
by name. The lab's controls and references register in :mod:`masklab.lab.routers`.

Every router ranks a document's units through one method, ``score``; what a router
accepts besides a model is declared here (:data:`TRAINED`, :data:`EMBEDDING`,
:data:`DECIDING`), so callers ask these lists, never a router's name or attributes."""

from __future__ import annotations

from masklab.context.router import ROUTERS, Router
from masklab.context.routers import bm25, cross, dense, fused, lexical, pruner, trained  # noqa: F401
from masklab.util.registry import Registry

TRAINED = ("evidence", "bm25+evidence")  # routers that read a trained router file (--router-file, --router-model)
EMBEDDING = ("dense", "bm25+dense")  # routers that embed sentences (their embedder can be named)
DECIDING = ("pruner", "pruner-ctx", "cross")  # routers that decide how much to keep (keep="auto", --threshold; --router-file takes their file)


def check_embedder(router: str, embedder: str | None, option: str = "embedder") -> None:
    """Refuse an ``embedder`` (given as ``option``) for a router that embeds no sentences,
    or one that is no sentence-transformers folder; nothing to check without one."""
    if embedder is None:
        return
    from masklab.context.embedder import check_folder
    from masklab.util.errors import MasklabError

    if router not in EMBEDDING:
        raise MasklabError(f"{option} is for the routers that embed sentences ({', '.join(EMBEDDING)}), not {router}")
    check_folder(embedder)


def load_router(name: str, model=None, embedder: str | None = None, registry: Registry | None = None,
                **kwargs) -> Router:
    """The router ``name`` of :data:`ROUTERS` (``lexical``, ``bm25``, ``dense``, ``pruner``,
    ``evidence``, ...; a kvpress press is no router: :data:`masklab.context.presses.PRESSES`
    builds those, and its name here is refused as an unknown router) for ``model``: a
    registered model name, a model directory, a loaded
    :class:`~masklab.pretrained.models.LoadedModel`, or None (routers that read no model then
    count words). ``embedder``: a sentence-transformers model folder for the routers of
    :data:`EMBEDDING` (None: the packaged all-MiniLM-L6-v2). ``registry``: another registry
    to build from (the lab's, :mod:`masklab.lab.routers`). ``kwargs`` go to the router (e.g.
    ``path=`` a trained router file)."""
    factory = (ROUTERS if registry is None else registry)[name]
    check_embedder(name, embedder)
    if embedder is not None:
        kwargs["embedder"] = embedder
    lm = model
    if isinstance(model, str):
        from masklab.pretrained.models import check_models, load

        check_models([model])
        lm = load(model)
    return factory(lm=lm, **kwargs)
