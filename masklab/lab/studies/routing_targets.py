"""Sweep: which training target makes a router keep what the teacher needs?

``masklab sweep routing-targets`` runs the routing study (:mod:`masklab.lab.studies.routing`)
on 2-hop multihop and stale with every kind of target side by side: causal evidence
(``loo``, ``greedy-minimal``), attention of the teacher aggregated four ways (last layer
mean over heads, mean over layers, max over heads, rollout) and selected two ways (top-k
with k = gold size, top-10%), the soft last-layer attention distribution (listwise loss),
and gold. It answers the routing issue's question "does the attention router's failure
depend on the aggregation?" with one table and one budget figure.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from masklab.lab.studies import routing

NAME = "routing-targets"
Config = routing.Config  # the sweep runs the routing study with other targets

TARGETS = [
    "gold",
    "causal",
    "greedy-minimal",
    "last-mean/topk",
    "layer-mean/topk",
    "max-head/topk",
    "rollout/topk",
    "last-mean/top10pct",
    "last-mean",
]


def quick_config() -> Config:
    return replace(routing.quick_config(), tasks=["multihop"], targets=TARGETS)


def reproduce_config() -> Config:
    return Config(tasks=["multihop", "stale"], hops=[2], targets=TARGETS, independent_targets=[], seeds=[0])


def run(
    cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab sweep routing-targets"
) -> dict:
    return routing.run(cfg, out, jobs, progress, command)
