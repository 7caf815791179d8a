"""Interventions that hide context items, batched, and the evidence sets they define.

Hiding an item (``mode``):

* ``"key_bias"`` (default) - its key gets ``-inf`` in the attention bias
  (:func:`masklab.priors.bias.key_bias`): no token can read it; it still flows through its own
  row, which nobody reads.
* ``"delete"`` - its token is removed from the sequence (the kept items are packed to the
  front, keeping their position ids, and the batch is re-padded). Cheaper for long
  contexts; must give the same answer as ``key_bias`` (tested).

All masked variants of one example - and, where the search allows it, of many examples -
run as one batched forward pass (split into chunks of at most ``chunk`` sequences).

The model is any module called as ``model(items, query, visible, positions)`` returning
``(logits (B, vocab), extras)``, e.g. :class:`masklab.models.reader.EvidenceReader`. Batches,
keep-masks and the searches' bookkeeping stay on the CPU; each forward pass moves its inputs
to the model's device and its logits back.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from masklab.util import device as devices
from masklab.lab.evidence.search import SEARCHES, Evidence
from masklab.util.errors import MasklabError
from masklab.lab.tasks.evidence_gyms import EvidenceBatch

MODES = ("key_bias", "delete")
CHUNK = 2048  # sequences per forward pass


def pack_visible(items: Tensor, positions: Tensor, visible: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Delete hidden items: ``(items (B, N, 2), positions (B, N), visible (B, N))`` ->
    the same with only visible items, packed to the front and padded to the largest
    visible count ``M``: ``(B, M, 2), (B, M), (B, M)``."""
    order = torch.argsort((~visible).to(torch.int8), dim=1, stable=True)  # visible first, in order
    m = int(visible.sum(1).max()) if visible.numel() else 0
    order = order[:, :m]
    items = torch.gather(items, 1, order[..., None].expand(-1, -1, items.shape[-1]))
    positions = torch.gather(positions, 1, order)
    return items, positions, torch.gather(visible, 1, order)


@torch.no_grad()
def answer_logits(model, batch: EvidenceBatch, keep: Tensor | None = None, mode: str = "key_bias") -> Tensor:
    """Logits ``(B, vocab)`` on the CPU with only the items in ``keep`` ``(B, N)`` visible
    (default all); the forward pass runs on the model's device."""
    if mode not in MODES:
        raise MasklabError(f"unknown intervention mode {mode!r}; choose from {', '.join(MODES)}")
    visible = batch.valid if keep is None else batch.valid & keep
    items, positions = batch.items, batch.positions
    if mode == "delete":
        items, positions, visible = pack_visible(items, positions, visible)
    dev = devices.of(model)
    return model(*devices.to((items, batch.query, visible, positions), dev))[0].cpu()


@torch.no_grad()
def variant_logits(
    model, batch: EvidenceBatch, keeps: Sequence[Tensor], mode: str = "key_bias", chunk: int = CHUNK
) -> list[Tensor]:
    """Evaluate masked variants of every example in batched forward passes.

    keeps: one ``(V_b, N_b)`` bool tensor per example (``N_b`` its item count or the padded
    width; V_b may be 0). Returns one ``(V_b, vocab)`` logits tensor per example.
    """
    N = batch.items.shape[1]
    rows, keep_rows = [], []
    for b, k in enumerate(keeps):
        if k.shape[0] == 0:
            continue
        full = torch.ones(k.shape[0], N, dtype=torch.bool)
        full[:, : k.shape[1]] = k
        rows.append(torch.full((k.shape[0],), b, dtype=torch.long))
        keep_rows.append(full)
    out = [torch.empty(0, 0) for _ in keeps]
    if not rows:
        return out
    idx, keep = torch.cat(rows), torch.cat(keep_rows)
    logits = []
    for s in range(0, len(idx), chunk):
        sub = batch.select(idx[s : s + chunk])
        logits.append(answer_logits(model, sub, keep[s : s + chunk], mode))
    logits = torch.cat(logits)
    start = 0
    for b, k in enumerate(keeps):
        out[b] = logits[start : start + k.shape[0]]
        start += k.shape[0]
    return out


def dense_answers(model, batch: EvidenceBatch) -> Tensor:
    """``(B,)`` the model's argmax answers on the full contexts."""
    return answer_logits(model, batch).argmax(-1)


def many_oracle(
    model, batch: EvidenceBatch, mode: str = "key_bias", chunk: int = CHUNK, reference: Tensor | None = None
):
    """Oracle for :meth:`EvidenceSearch.find_many`: a variant *holds* when its argmax answer
    equals ``reference`` (default: the model's dense answer)."""
    ref = dense_answers(model, batch) if reference is None else reference

    def holds_many(keeps: list[Tensor]) -> list[Tensor]:
        logits = variant_logits(model, batch, keeps, mode, chunk)
        return [
            lg.argmax(-1) == ref[b] if lg.numel() else torch.zeros(0, dtype=torch.bool) for b, lg in enumerate(logits)
        ]

    return holds_many


def oracle(model, batch: EvidenceBatch, index: int, mode: str = "key_bias"):
    """Single-example oracle ``holds(keep (V, n)) -> (V,)`` for :data:`SEARCHES`."""
    one = batch.select([index])
    many = many_oracle(model, one, mode)
    return lambda keep: many([keep])[0]


def evidence_sets(
    model,
    batch: EvidenceBatch,
    method: str = "loo",
    mode: str = "key_bias",
    orders: Sequence[Sequence[int] | None] | None = None,
    chunk: int = CHUNK,
) -> list[Evidence]:
    """Causal evidence of every example: ``method`` from :data:`SEARCHES` ("loo",
    "greedy-minimal", "group-testing"), relative to the model's own dense answer.
    Returns one :class:`Evidence` (item indices, forward passes) per example."""
    if method not in SEARCHES:
        raise MasklabError(f"unknown evidence method {method!r}; choose from {', '.join(SEARCHES)}")
    model.eval()
    n_items = batch.n_items.tolist()
    return SEARCHES[method].find_many(many_oracle(model, batch, mode, chunk), n_items, orders)


def evidence_mask(evidence: Sequence[Evidence], width: int) -> Tensor:
    """``(B, width)`` bool mask of the evidence items."""
    mask = torch.zeros(len(evidence), width, dtype=torch.bool)
    for b, ev in enumerate(evidence):
        mask[b, ev.items] = True
    return mask
