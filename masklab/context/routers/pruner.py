"""``pruner``: the sentence-embedding model trained on causal labels of real documents
(:mod:`masklab.context.pruner`); ``pruner-ctx``: the same scores read beside each unit's
neighbours (:mod:`masklab.context.contextual`). The same models trained on other labels are
the lab's controls (:mod:`masklab.lab.routers.controls`)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from masklab.context.router import ROUTERS, Router, Scores

WEIGHTS = Path(__file__).resolve().parent.parent / "weights" / "pruner"


@lru_cache(maxsize=4)
def cached_pruner(path: str):
    """The pruner file ``path`` loaded, once per process (4 at most)."""
    from masklab.context.pruner import load_pruner

    return load_pruner(Path(path))


@ROUTERS.register("pruner")
class Pruner(Router):
    """``path``: a pruner file (``masklab train-router --kind pruner``; None: the shipped one of these labels);
    ``int8``: its encoder's linear layers in int8 (as :class:`ContextPruner`'s)."""

    use = (
        "any document: MiniLM fine-tuned (LoRA) on causal labels of real documents, above dense and bm25+dense on "
        "both real-document test splits; --keep auto decides how much; train-router --kind pruner trains yours"
    )
    labels = "causal"
    options = ("path", "int8")
    score_range = (-1.0, 1.0)  # cosines

    @classmethod
    def weights_file(cls, path: str | Path | None = None) -> Path:
        return Path(path) if path is not None else WEIGHTS / f"{cls.labels}.safetensors"

    def __init__(self, lm=None, path: str | Path | None = None, int8: bool = False) -> None:
        super().__init__(lm)
        self.path = self.weights_file(path)
        self.model, self.meta = (cached_int8_pruner if int8 else cached_pruner)(str(self.path))
        self.take_capabilities(path)  # keep_auto: the score from which --keep auto keeps a unit

    def score(self, doc, question):
        return self.model.rank(question, doc.units)


@lru_cache(maxsize=1)
def cached_int8_pruner(path: str):
    """A pruner of its own (its own embedder and cache) with its encoder's linear layers in int8
    (:func:`~masklab.context.embedder.int8_linears`)."""
    from masklab.context.embedder import Embedder, int8_linears
    from masklab.context.pruner import load_pruner

    model, meta = load_pruner(Path(path))
    if model.design == "head":  # its encoder is the shared float one (dense reads it): one of its own
        model.embedder = Embedder()
    int8_linears(model.embedder.model)
    return model, meta


@lru_cache(maxsize=2)
def _load_head(path: str, features: tuple[str, ...] | None = None):
    """The context head file ``path`` (trained on ``features``; None: ``pruner-ctx``'s)."""
    from masklab.context.contextual import FEATURES, load_head

    return load_head(Path(path), features or FEATURES)


def clear_caches() -> None:
    """Forget the loaded pruners (a router that holds one keeps it; one no router holds is freed)."""
    for cache in (cached_pruner, cached_int8_pruner, _load_head):
        cache.cache_clear()


@ROUTERS.register("pruner-ctx")
class ContextPruner(Router):
    """``path``: a context head file (``masklab train-router --kind pruner-ctx``; None: the shipped one), read
    on top of the shipped `pruner`. Scores are keep probabilities in [0, 1]."""

    use = (
        "any document, questions whose answer spans sentences or updates: the pruner's scores read beside each "
        "unit's neighbours and the more relevant units, trained on causal keep-set labels; --threshold or "
        "--keep auto"
    )
    score_range = (0.0, 1.0)
    options = ("path", "int8")
    labels = "union"

    @classmethod
    def weights_file(cls, path: str | Path | None = None) -> Path:
        return Path(path) if path is not None else WEIGHTS / f"ctx-{cls.labels}.safetensors"

    def __init__(self, lm=None, path: str | Path | None = None, int8: bool = False) -> None:
        """``int8``: the pruner's encoder's linear layers in int8 (:func:`~masklab.context.embedder.int8_linears`):
        about half the first question's time on a CPU, val MRR close to float's (docs/context.md)."""
        super().__init__(lm)
        self.path = self.weights_file(path)
        self.head, self.meta = _load_head(str(self.path), self.features())
        self.pruner = (cached_int8_pruner if int8 else cached_pruner)(str(WEIGHTS / "causal.safetensors"))[0]
        self.take_capabilities(path)  # keep_auto, keep_rule, neighbours (units kept beside the best one): chosen on val

    @classmethod
    def features(cls) -> tuple[str, ...] | None:
        """The features its head reads (None: :data:`masklab.context.contextual.FEATURES`)."""
        return None

    def score(self, doc, question):
        return self.read(doc, [question]).values[0]

    def read(self, doc, questions):
        from masklab.context.contextual import probabilities

        emb = self.pruner.embedder
        units, qs = emb.units(doc.units), emb.encode(list(questions))  # one batch of questions
        return Scores([probabilities(self.head, units, q) for q in qs])
