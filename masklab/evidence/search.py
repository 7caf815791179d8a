"""Evidence-set searches over a context split into items.

A search only needs an *oracle* ``holds(keep) -> ok``: ``keep`` is a ``(V, N)`` bool tensor,
one row per masked variant of the context (True = item visible), and ``ok[v]`` says whether
the model's answer with only row ``v``'s items still equals its answer on the full context
(argmax equality for a masklab teacher; for a real LM, e.g. the log-probability of the
answer staying within a tolerance). All variants of one call run as one batched forward
pass; every search reports ``forward_passes``, the number of sequences it evaluated.

Searches (registry :data:`SEARCHES`, one class each, one method ``find``):

* ``loo`` - leave-one-out *necessity*: the items whose hiding (alone) breaks the answer.
  Exactly ``N`` variants in one batch.
* ``greedy-minimal`` - a *minimal sufficient* set: starting from all items, drop items one at
  a time (in ``order``) and keep a drop whenever the answer still holds. The result
  reproduces the answer on its own and no single item of it can be dropped (1-minimal);
  it contains every ``loo`` item. ``N`` sequential variants per example; across examples
  step ``i`` runs as one batch.
* ``group-testing`` - the ``loo`` set found by adaptive binary splitting (Hwang): hide every
  item not yet classified; if the answer holds, none of them is necessary and the search
  ends. Otherwise binary-search that group for one necessary item (hide the first half: if
  the answer holds, that half is clean and the second half must contain the item, without
  a test), record it, and repeat. With ``k`` necessary items it uses at most
  ``k * ceil(log2 N) + k + 1`` variants (sequential, one per forward pass). It returns
  exactly the ``loo`` set when hiding a group breaks the answer iff the group contains a
  ``loo`` item (no redundancy between items); otherwise the two may differ, and the
  agreement is worth measuring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

Oracle = Callable[[Tensor], Tensor]
# Many examples at once: a list of (V_b, N_b) keep-masks -> a list of (V_b,) bool results.
ManyOracle = Callable[[list[Tensor]], list[Tensor]]


@dataclass
class Evidence:
    """Items (sorted indices) and the number of sequences the search evaluated."""

    items: list[int]
    forward_passes: int


SEARCHES: dict[str, "EvidenceSearch"] = {}


def register(name: str):
    def wrap(cls):
        cls.name = name
        SEARCHES[name] = cls()
        return cls

    return wrap


def hide_rows(groups: Sequence[Sequence[int]], n_items: int) -> Tensor:
    """``(len(groups), n_items)`` keep-masks: row r hides the items of ``groups[r]``."""
    keep = torch.ones(len(groups), n_items, dtype=torch.bool)
    for r, g in enumerate(groups):
        keep[r, list(g)] = False
    return keep


class EvidenceSearch:
    name = "base"

    def find(self, holds: Oracle, n_items: int, order: Sequence[int] | None = None) -> Evidence:
        """Search the evidence of one example with ``n_items`` items."""
        raise NotImplementedError

    def find_many(self, holds_many: ManyOracle, n_items: Sequence[int], orders: Sequence[Sequence[int] | None] | None = None) -> list[Evidence]:
        """Search several examples; ``holds_many`` evaluates one keep-mask list (one entry per
        example) in a single batched call. Default: one example after another; searches
        whose variants do not depend on earlier answers (``loo``) batch all examples."""
        orders = orders if orders is not None else [None] * len(n_items)
        out = []
        for b, n in enumerate(n_items):
            out.append(self.find(lambda keep, b=b: _one(holds_many, b, len(n_items), keep), n, orders[b]))
        return out


def _one(holds_many: ManyOracle, b: int, n_examples: int, keep: Tensor) -> Tensor:
    """Ask a many-example oracle about example ``b`` only (the others get no variants)."""
    keeps = [torch.ones(0, keep.shape[1], dtype=torch.bool) for _ in range(n_examples)]
    keeps[b] = keep
    return holds_many(keeps)[b]


@register("loo")
class LeaveOneOut(EvidenceSearch):
    def find(self, holds: Oracle, n_items: int, order: Sequence[int] | None = None) -> Evidence:
        ok = holds(hide_rows([[i] for i in range(n_items)], n_items))
        return Evidence([i for i in range(n_items) if not ok[i]], n_items)

    def find_many(self, holds_many, n_items, orders=None):
        oks = holds_many([hide_rows([[i] for i in range(n)], n) for n in n_items])
        return [Evidence([i for i in range(n) if not ok[i]], n) for ok, n in zip(oks, n_items)]


@register("greedy-minimal")
class GreedyMinimal(EvidenceSearch):
    def find(self, holds: Oracle, n_items: int, order: Sequence[int] | None = None) -> Evidence:
        """``order``: items to try dropping first (default index order); e.g. least
        attended first."""
        keep = torch.ones(n_items, dtype=torch.bool)
        for i in order if order is not None else range(n_items):
            keep[i] = False
            if not bool(holds(keep[None])[0]):
                keep[i] = True
        return Evidence(keep.nonzero().flatten().tolist(), n_items)

    def find_many(self, holds_many, n_items, orders=None):
        """The same sets as :meth:`find` per example, with step ``i`` of every example (try
        dropping its ``i``-th item) in one batched call: ``max(n)`` calls instead of ``sum(n)``."""
        orders = [list(o) if o is not None else list(range(n)) for o, n in zip(orders or [None] * len(n_items), n_items)]
        keeps = [torch.ones(n, dtype=torch.bool) for n in n_items]
        for step in range(max(n_items, default=0)):
            trials = []
            for keep, order in zip(keeps, orders):
                trial = keep.clone()[None]
                if step < len(order):
                    trial[0, order[step]] = False
                else:
                    trial = trial[:0]  # this example has no item left to try
                trials.append(trial)
            for b, ok in enumerate(holds_many(trials)):
                if len(ok) and bool(ok[0]):
                    keeps[b] = trials[b][0]
        return [Evidence(keep.nonzero().flatten().tolist(), n) for keep, n in zip(keeps, n_items)]


@register("group-testing")
class GroupTesting(EvidenceSearch):
    def find(self, holds: Oracle, n_items: int, order: Sequence[int] | None = None) -> Evidence:
        unknown = list(range(n_items))
        found: list[int] = []
        passes = 0
        while unknown:
            passes += 1  # does hiding every unknown item break the answer?
            if bool(holds(hide_rows([unknown], n_items))[0]):
                break
            group = unknown  # contains a necessary item: binary search for one
            while len(group) > 1:
                left, right = group[: len(group) // 2], group[len(group) // 2 :]
                passes += 1
                if bool(holds(hide_rows([left], n_items))[0]):
                    unknown = [i for i in unknown if i not in set(left)]  # left is clean
                    group = right  # known to contain one, without a test
                else:
                    group = left
            found.append(group[0])
            unknown.remove(group[0])
        return Evidence(sorted(found), passes)
