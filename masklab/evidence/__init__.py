"""Causal evidence: interventions that hide context items, and evidence-set searches."""

from masklab.evidence.search import SEARCHES, Evidence, EvidenceSearch, hide_rows

__all__ = ["SEARCHES", "Evidence", "EvidenceSearch", "hide_rows"]
