"""Attention targets: what the teacher *looks at*, from the query token onto each item.

Aggregations (registry :data:`AGGREGATES`, each ``attn -> scores``; ``attn`` is the list of
per-block probabilities ``(B, H, T, T)`` with the query token at index 0 and item ``i`` at
index ``i + 1``; scores are ``(B, N)``):

* ``last-mean`` - last layer, mean over heads, query row;
* ``layer-mean`` - mean over layers and heads, query row;
* ``max-head`` - last layer, max over heads, query row;
* ``rollout`` - attention rollout (Abnar & Zuidema 2020): per layer ``0.5 * mean_h(A) +
  0.5 * I`` (rows renormalised), multiplied from the first layer to the last; query row.
* ``layer<l>`` (``layer0``, ``layer1``, ...) - layer ``l`` alone, mean over heads.

Selections (registry :data:`SELECTIONS`, ``scores (B, N), valid (B, N), k -> (B, N) bool``):

* ``topk`` - the ``k`` highest-scoring items (``k`` an int or a ``(B,)`` tensor, e.g. the
  gold evidence size of each example);
* ``top10pct`` - the top ``ceil(0.1 * n)`` items of each example (``n`` its item count).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from masklab.util import device as devices
from masklab.util.errors import MasklabError
from masklab.util.registry import Registry
from masklab.lab.tasks.evidence_gyms import EvidenceBatch

AGGREGATES: Registry[Callable[[list[Tensor]], Tensor]] = Registry("attention aggregate")
SELECTIONS: Registry[Callable[..., Tensor]] = Registry("attention selection")
aggregate = AGGREGATES.register


@aggregate("last-mean")
def last_mean(attn: list[Tensor]) -> Tensor:
    return attn[-1].mean(1)[:, 0, 1:]


@aggregate("layer-mean")
def layer_mean(attn: list[Tensor]) -> Tensor:
    return torch.stack([a.mean(1)[:, 0, 1:] for a in attn]).mean(0)


@aggregate("max-head")
def max_head(attn: list[Tensor]) -> Tensor:
    return attn[-1].amax(1)[:, 0, 1:]


@aggregate("rollout")
def rollout(attn: list[Tensor]) -> Tensor:
    T = attn[0].shape[-1]
    eye = torch.eye(T, dtype=attn[0].dtype)
    flow = eye.expand_as(attn[0][:, 0]).clone()  # (B, T, T)
    for a in attn:
        step = 0.5 * a.mean(1) + 0.5 * eye
        step = step / step.sum(-1, keepdim=True)
        flow = step @ flow
    return flow[:, 0, 1:]


def per_layer(attn: list[Tensor]) -> Tensor:
    """``(B, L, N)``: each layer's query-row attention onto the items, mean over heads."""
    return torch.stack([a.mean(1)[:, 0, 1:] for a in attn], dim=1)


def aggregate_fn(name: str) -> Callable[[list[Tensor]], Tensor]:
    if name in AGGREGATES:
        return AGGREGATES[name]
    if name.startswith("layer") and name[5:].isdigit():
        layer = int(name[5:])
        return lambda attn: attn[layer].mean(1)[:, 0, 1:]
    raise MasklabError(f"unknown attention aggregate {name!r}; choose from {', '.join(AGGREGATES)} or layer<l>")


selection = SELECTIONS.register


@selection("topk")
def top_k(scores: Tensor, valid: Tensor, k: int | Tensor) -> Tensor:
    """Keep the ``k`` best valid items per example (ties broken by index)."""
    B, N = scores.shape
    k = torch.as_tensor(k).expand(B).clamp(0, N)
    s = scores.masked_fill(~valid, float("-inf"))
    order = torch.sort(s, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(N).expand(B, N))
    return (rank < k[:, None]) & valid


@selection("top10pct")
def top_10pct(scores: Tensor, valid: Tensor, k: int | Tensor | None = None) -> Tensor:
    k = torch.tensor([max(1, math.ceil(0.1 * int(n))) for n in valid.sum(1)])
    return top_k(scores, valid, k)


@torch.no_grad()
def attention_maps(model, batch: EvidenceBatch) -> list[Tensor]:
    """Per-block attention ``[(B, H, N+1, N+1)]`` of the model on the full contexts, on the CPU
    (the forward pass runs on the model's device)."""
    model.eval()
    inputs = devices.to((batch.items, batch.query, batch.valid, batch.positions), devices.of(model))
    return [a.cpu() for a in model(*inputs, return_attn=True)[1]]


def attention_targets(
    model,
    batch: EvidenceBatch,
    aggregate: str = "last-mean",
    select: str | None = None,
    k: int | Tensor | None = None,
) -> Tensor:
    """Attention of the query onto each item: scores ``(B, N)`` (padding gets 0), or with
    ``select`` ("topk" with ``k``, default the gold size; "top10pct") a ``(B, N)`` bool target."""
    scores = aggregate_fn(aggregate)(attention_maps(model, batch)).masked_fill(~batch.valid, 0.0)
    if select is None:
        return scores
    return SELECTIONS[select](scores, batch.valid, batch.gold.sum(1) if k is None else k)
