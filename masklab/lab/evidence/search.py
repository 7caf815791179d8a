"""Evidence-set searches over a context split into items.

A search only needs an *oracle* ``holds(keep) -> ok``: ``keep`` is a ``(V, N)`` bool tensor,
one row per masked variant of the context (True = item visible), and ``ok[v]`` says whether
the model's answer with only row ``v``'s items still equals its answer on the full context
(argmax equality for a masklab teacher; for a real LM, e.g. the log-probability of the
answer staying within a tolerance). All variants of one call run as one batched forward
pass; every search reports ``forward_passes``, the number of sequences it evaluated.

Searches (registry :data:`SEARCHES`, one class each with one method to override,
``steps``: a generator that yields keep-masks and receives the oracle's answers).
:meth:`EvidenceSearch.find` runs it on one example; :meth:`EvidenceSearch.find_many` runs
the searches of many examples in lockstep, one batched oracle call per step.

* ``loo`` - leave-one-out *necessity*: the items whose hiding (alone) breaks the answer.
  Exactly ``N`` variants in one batch.
* ``greedy-minimal`` - a *minimal sufficient* set: starting from all items, drop items one at
  a time (in ``order``) and keep a drop whenever the answer still holds. The result
  reproduces the answer on its own and no single item of it can be dropped (1-minimal);
  it contains every ``loo`` item. ``N`` sequential variants per example.
* ``group-testing`` - the ``loo`` set found by adaptive binary splitting (Hwang): hide every
  item not yet classified; if the answer holds, none of them is necessary and the search
  ends. Otherwise binary-search that group for one necessary item (hide the first half: if
  the answer holds, that half is clean and the second half must contain the item, without
  a test), record it, and repeat. With ``k`` necessary items it uses at most
  ``k * ceil(log2 N) + k + 1`` sequential variants. It returns exactly the ``loo`` set when
  hiding a group breaks the answer iff the group contains a ``loo`` item (no redundancy
  between items); otherwise the two may differ, and the agreement is worth measuring.

  No search that does not know ``k`` can promise ``k * ceil(log2 N) + 1`` variants: with
  ``k = 0`` that allows one variant, which must hide everything; with ``N = 2, k = 1`` it
  then allows one more, which must hide exactly the item that is *not* necessary to clear
  it, and that item is not known yet. Binary splitting pays one extra variant per found
  item (re-testing the remaining unknown items).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, Sequence

import torch
from torch import Tensor

from masklab.util.registry import Registry

Oracle = Callable[[Tensor], Tensor]
# Many examples at once: a list of (V_b, N_b) keep-masks -> a list of (V_b,) bool results.
ManyOracle = Callable[[list[Tensor]], list[Tensor]]
# A search of one example: yields (V, N) keep-masks, is sent their (V,) answers, returns its items.
Steps = Generator[Tensor, Tensor, list[int]]


@dataclass
class Evidence:
    """Items (sorted indices) and the number of sequences the search evaluated."""

    items: list[int]
    forward_passes: int


SEARCHES: Registry["EvidenceSearch"] = Registry("search", instantiate=True)
register = SEARCHES.register


def hide_rows(groups: Sequence[Sequence[int]], n_items: int) -> Tensor:
    """``(len(groups), n_items)`` keep-masks: row r hides the items of ``groups[r]``."""
    keep = torch.ones(len(groups), n_items, dtype=torch.bool)
    for r, g in enumerate(groups):
        keep[r, list(g)] = False
    return keep


class EvidenceSearch:
    name = "base"

    def steps(self, n_items: int, order: Sequence[int] | None) -> Steps:
        """The search of one example with ``n_items`` items: ``ok = yield keep`` asks the
        oracle about the variants ``keep`` ``(V, n_items)``; the return value is the set."""
        raise NotImplementedError

    def find(self, holds: Oracle, n_items: int, order: Sequence[int] | None = None) -> Evidence:
        """Search the evidence of one example with ``n_items`` items."""
        return self.find_many(lambda keeps: [holds(keeps[0])], [n_items], [order])[0]

    def find_many(
        self, holds_many: ManyOracle, n_items: Sequence[int], orders: Sequence[Sequence[int] | None] | None = None
    ) -> list[Evidence]:
        """Search several examples in lockstep: step ``s`` of every unfinished example is one
        call of ``holds_many`` (one keep-mask per example, empty for finished ones), so the
        calls number the longest search, not the sum."""
        orders = orders if orders is not None else [None] * len(n_items)
        runs = [self.steps(n, o) for n, o in zip(n_items, orders)]
        asks: list[Tensor | None] = [None] * len(runs)
        out: list[Evidence | None] = [None] * len(runs)
        passes = [0] * len(runs)

        def advance(b: int, answer: Tensor | None) -> None:
            try:
                asks[b] = next(runs[b]) if answer is None else runs[b].send(answer)
                passes[b] += len(asks[b])
            except StopIteration as stop:
                asks[b], out[b] = None, Evidence(sorted(stop.value), passes[b])

        for b in range(len(runs)):
            advance(b, None)
        while any(a is not None for a in asks):
            keeps = [a if a is not None else torch.ones(0, n, dtype=torch.bool) for a, n in zip(asks, n_items)]
            oks = holds_many(keeps)
            for b in range(len(runs)):
                if asks[b] is not None:
                    advance(b, oks[b])
        return out


@register("loo")
class LeaveOneOut(EvidenceSearch):
    def steps(self, n_items, order):
        ok = yield hide_rows([[i] for i in range(n_items)], n_items)
        return [i for i in range(n_items) if not ok[i]]


@register("greedy-minimal")
class GreedyMinimal(EvidenceSearch):
    def steps(self, n_items, order):
        """``order``: items to try dropping first (default index order), e.g. least attended first."""
        keep = torch.ones(n_items, dtype=torch.bool)
        for i in order if order is not None else range(n_items):
            keep[i] = False
            ok = yield keep[None].clone()
            if not bool(ok[0]):
                keep[i] = True
        return keep.nonzero().flatten().tolist()


@register("group-testing")
class GroupTesting(EvidenceSearch):
    def steps(self, n_items, order):
        unknown = list(range(n_items))
        found: list[int] = []
        while unknown:
            ok = yield hide_rows([unknown], n_items)  # does hiding every unknown item break the answer?
            if bool(ok[0]):
                break
            group = unknown  # contains a necessary item: binary search for one
            while len(group) > 1:
                left, right = group[: len(group) // 2], group[len(group) // 2 :]
                ok = yield hide_rows([left], n_items)
                if bool(ok[0]):
                    unknown = [i for i in unknown if i not in set(left)]  # left is clean
                    group = right  # known to contain one, without a test
                else:
                    group = left
            found.append(group[0])
            unknown.remove(group[0])
        return found
