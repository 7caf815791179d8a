"""Every registered router: importing this package registers them in
:data:`masklab.context.router.ROUTERS` (one file each; the kvpress presses in one table),
and :func:`load_router` builds one by name."""

from __future__ import annotations

from masklab.context.router import ROUTERS, Router
from masklab.context.routers import bm25, dense, fused, lexical, longllmlingua, oracle, pruner, trained  # noqa: F401

TRAINED = ("evidence", "attention", "bm25+evidence", "bm25+attention")  # routers that read a trained router file
EMBEDDING = ("dense", "bm25+dense")  # routers that embed sentences (their embedder can be named)
DECIDING = ("pruner", "pruner-attention", "pruner-marks", "pruner-ctx", "pruner-ctx-attention")  # routers that decide how much to keep (keep="auto")


def load_router(name: str, model=None, embedder: str | None = None, **kwargs) -> Router:
    """The router ``name`` (``lexical``, ``bm25``, ``oracle-gold``, ``evidence``,
    ``attention``, or a kvpress press name) for ``model``: a registered model name, a model
    directory, a loaded :class:`~masklab.pretrained.models.LoadedModel`, or None (routers
    that read no model then count words). ``embedder``: a sentence-transformers model folder
    for the routers of :data:`EMBEDDING` (None: the packaged all-MiniLM-L6-v2). ``kwargs`` go
    to the router (e.g. ``path=`` a trained router file, ``seed=`` for ``oracle-gold``)."""
    from masklab.errors import MasklabError

    factory = ROUTERS[name]
    if embedder is not None:
        if name not in EMBEDDING:
            raise MasklabError(f"an embedder is for the routers that embed sentences ({', '.join(EMBEDDING)}), "
                               f"not {name}")
        kwargs["embedder"] = embedder
    lm = model
    if isinstance(model, str):
        from masklab.pretrained.models import check_models, load

        check_models([model])
        lm = load(model)
    return factory(lm=lm, **kwargs)
