"""The controls: the product's trained routers with other labels, same design and data.

``attention`` is the evidence router's features, data and model class trained on the LM's
most attended units; ``bm25+attention`` fuses it with BM25 as ``bm25+evidence`` fuses the
evidence router; ``pruner-attention`` and ``pruner-marks`` are the pruner trained on
attention labels and on the writers' marked answering sentences (weights shipped beside
the pruner's); ``pruner-ctx-attention`` the context pruner's head trained on attention labels;
``cross-marks-common``, ``cross-keepset-common`` and ``cross-attention-common`` the cross pruner
trained on the same questions with each kind of labels (``scripts/train_cross.py --common``, one
hop), the controlled comparison of the labels."""

from __future__ import annotations

from pathlib import Path

from masklab.lab.routers.cross import CrossRouter
from masklab.context.routers.fused import Fused
from masklab.context.routers.pruner import ContextPruner, Pruner
from masklab.context.routers.trained import TrainedRouter
from masklab.lab.routers.registry import LAB_ROUTERS
from masklab.util.errors import MasklabError

CROSS_RESULTS = Path(__file__).resolve().parents[3] / "results" / "cross"


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


class CrossLabels(CrossRouter):
    """The cross pruner trained on :attr:`labels` over the questions every label kind covers
    (``results/cross/LABELS-common.safetensors``), read with one hop."""

    labels = "marks"
    options = ("int8",)

    def __init__(self, lm=None, **options) -> None:
        path = CROSS_RESULTS / f"{self.labels}-common.safetensors"
        if not path.is_file():
            raise MasklabError(
                f"{path} is missing: python scripts/train_cross.py --labels marks,keepset,attention --common trains it"
            )
        super().__init__(lm, path=path, **options)
        self.hops = 1


@LAB_ROUTERS.register("cross-marks-common")
class CrossMarks(CrossLabels):
    use = "a research comparison: the cross pruner trained on the writers' marks (the label comparison's questions)"


@LAB_ROUTERS.register("cross-keepset-common")
class CrossKeepset(CrossLabels):
    use = "a research comparison: the cross pruner trained on causal keep-set labels (the same questions)"
    labels = "keepset"


@LAB_ROUTERS.register("cross-attention-common")
class CrossAttention(CrossLabels):
    use = "a research control: the cross pruner trained on attention labels (the same questions)"
    labels = "attention"
