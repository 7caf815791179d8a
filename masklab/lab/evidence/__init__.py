"""Causal evidence: interventions that hide context items, evidence-set searches, attention targets.

Library entry points: :func:`evidence_sets` (causal evidence by intervention, methods from
:data:`SEARCHES`) and :func:`attention_targets` (what the model attends to, aggregations from
:data:`AGGREGATES` and selections from :data:`SELECTIONS`).
"""

from masklab.lab.evidence.attention_targets import AGGREGATES, SELECTIONS, attention_targets
from masklab.lab.evidence.interventions import MODES, answer_logits, evidence_mask, evidence_sets, variant_logits
from masklab.lab.evidence.search import SEARCHES, Evidence, EvidenceSearch, hide_rows

__all__ = [
    "AGGREGATES",
    "MODES",
    "SEARCHES",
    "SELECTIONS",
    "Evidence",
    "EvidenceSearch",
    "answer_logits",
    "attention_targets",
    "evidence_mask",
    "evidence_sets",
    "hide_rows",
    "variant_logits",
]
