"""The controls: the product's trained routers with other labels, same design and data.

``attention`` is the evidence router's features, data and model class trained on the LM's
most attended units; ``bm25+attention`` fuses it with BM25 as ``bm25+evidence`` fuses the
evidence router; ``pruner-attention`` and ``pruner-marks`` are the pruner trained on
attention labels and on the writers' marked answering sentences (weights shipped beside
the pruner's); ``pruner-ctx-attention`` the context pruner's head trained on attention labels."""

from __future__ import annotations

from masklab.context.routers.fused import Fused
from masklab.context.routers.pruner import ContextPruner, Pruner
from masklab.context.routers.trained import TrainedRouter
from masklab.lab.routers.registry import LAB_ROUTERS


@LAB_ROUTERS.register("attention")
class AttentionRouter(TrainedRouter):
    """The same features, data and model class, trained on the LM's most attended units."""

    use = "a research control: the evidence router's features and data, trained on attention labels"

    kind = "attention"


@LAB_ROUTERS.register("bm25+attention")
class BM25Attention(Fused):
    """The control: BM25 with the attention-label router, combined the same way."""

    use = "a research control: bm25+evidence with the attention-label router"

    other_cls = AttentionRouter


@LAB_ROUTERS.register("pruner-attention")
class PrunerAttention(Pruner):
    """The control: the same design and data, trained on attention labels."""

    use = "a research control: the pruner trained on attention labels"
    labels = "attention"


@LAB_ROUTERS.register("pruner-marks")
class PrunerMarks(Pruner):
    """The same design and data, trained on the writers' marked answering sentences."""

    use = "a research comparison: the pruner trained on the writers' marks"
    labels = "marks"


@LAB_ROUTERS.register("pruner-ctx-attention")
class ContextPrunerAttention(ContextPruner):
    """The control: the same head and data, trained on attention labels."""

    use = "a research control: the context pruner trained on attention labels"
    labels = "attention"
