"""Training targets for routers, computed on the fly from a batch: one name, one ``(B, N)`` mask.

Names (:func:`target_names` lists them):

* ``gold`` - the gym's exact evidence (oracle upper bound);
* a search from :data:`~masklab.lab.evidence.search.SEARCHES` (``loo``, ``greedy-minimal``,
  ``group-testing``) - causal evidence of the teacher's own dense answer, by intervention;
* ``<aggregate>/<selection>`` - an attention target, e.g. ``last-mean/topk`` (k = gold size
  unless ``k`` is given) or ``rollout/top10pct``;
* ``<aggregate>`` alone - the soft attention scores ``(B, N)`` (float), e.g. for a KL target.

Typical use (routing): draw a fresh batch from the gym every step and call
``target_masks(teacher, batch, "loo")``; leave-one-out runs all ``B x N`` masked variants in
batched forward passes, so it stays cheap for small teachers.
"""

from __future__ import annotations

from torch import Tensor

from masklab.lab.evidence.attention_targets import AGGREGATES, SELECTIONS, attention_targets
from masklab.lab.evidence.interventions import evidence_mask, evidence_sets
from masklab.lab.evidence.search import SEARCHES
from masklab.util.errors import MasklabError
from masklab.lab.tasks.evidence_gyms import EvidenceBatch


def target_names() -> list[str]:
    return ["gold", *SEARCHES, *AGGREGATES, *(f"{a}/{s}" for a in AGGREGATES for s in SELECTIONS)]


def target_masks(
    model, batch: EvidenceBatch, name: str, mode: str = "key_bias", k: int | Tensor | None = None
) -> Tensor:
    """``(B, N)`` target for every example of ``batch`` (bool, or float scores for a bare aggregate)."""
    if name == "gold":
        return batch.gold.clone()
    if name in SEARCHES:
        return evidence_mask(evidence_sets(model, batch, name, mode), batch.items.shape[1])
    agg, _, sel = name.partition("/")
    if agg in AGGREGATES or (agg.startswith("layer") and agg[5:].isdigit()):
        return attention_targets(model, batch, agg, sel or None, k)
    raise MasklabError(f"unknown target {name!r}; choose from {', '.join(target_names())}")
