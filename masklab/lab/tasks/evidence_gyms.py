"""Evidence gyms: generated tasks whose evidence is known exactly.

Every example is a context of ``n`` *items* followed by a *query*; the answer is one symbol.
Each item and the query are ``F = 2`` symbol fields (0 is the null/padding symbol), so a
model can read one item as one token. A batch holds examples of different ``n`` padded to
the longest (``valid`` marks real items). ``gold`` marks the items the answer is derived
from (the exact evidence), and :meth:`Gym.solve` re-derives the answer from any visible
subset of items (``-1`` when it is no longer defined), which is how the tests check that
gold evidence is right: the answer follows from the gold items alone and not when any one
of them is removed.

Gyms (registry :data:`GYMS`):

* ``multihop`` - pointer facts ``a -> b`` (fields ``[a, b]``); the query ``[s0, h]`` asks for
  the symbol reached from ``s0`` after ``h = hops`` links (the query's second field is the
  hop count, so a hop curriculum can mix chain lengths). The gold chain is embedded in a
  longer path (with probability 1/2 something points *into* ``s0`` and the answer points
  *on* to another symbol), and every distractor is a path of the same shape (``hops``
  links, optional pre/post link) over disjoint symbols, so neither "the chain's end" nor
  "the chain whose root is not pointed to" gives the answer: each gold link is necessary.
  Gold = the ``hops`` chain links. Item order is shuffled.
* ``stale`` - assignments ``key = value`` (fields ``[key, value]``); the queried key is
  assigned ``updates`` (>= 2) times with distinct values at random positions, other keys
  1..``updates`` times; answer = the value of the *latest* (highest position) assignment.
  Gold = that latest assignment only.
* ``kv`` - distinct keys with values; answer = the queried key's value; gold = that pair.
* ``aggregate`` - tagged items ``[tag, value]``; the query ``[t, 0]`` asks *how many* items
  carry tag ``t`` (1..``max_count``); the answer symbol is the count itself. Gold = all
  items with tag ``t``: a set of size > 1 without any chain, every member necessary.

Symbols: ``1 .. vocab - 1``; :func:`make_gym` checks that ``vocab`` is large enough for the
longest context it will generate.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from masklab.util.errors import MasklabError
from masklab.util.registry import Registry

PAD = 0
N_FIELDS = 2


@dataclass
class EvidenceBatch:
    """A padded batch of ``B`` examples with at most ``N`` items.

    items ``(B, N, 2)`` long (PAD beyond ``n``), valid ``(B, N)`` bool, positions ``(B, N)``
    long (item ``i`` sits at position ``i + 1``; the query is position 0; deleting items
    keeps the others' positions), query ``(B, 2)`` long, answer ``(B,)`` long, gold
    ``(B, N)`` bool, hops ``(B,)`` long (multihop: links to follow; else 0).
    """

    task: str
    items: Tensor
    valid: Tensor
    positions: Tensor
    query: Tensor
    answer: Tensor
    gold: Tensor
    hops: Tensor

    def __len__(self) -> int:
        return self.items.shape[0]

    @property
    def n_items(self) -> Tensor:
        """``(B,)`` number of real items per example."""
        return self.valid.sum(1)

    def select(self, idx) -> "EvidenceBatch":
        """Sub-batch of the examples ``idx`` (a slice, index list or bool mask)."""
        return replace(self, **{f.name: getattr(self, f.name)[idx] for f in fields(self) if f.name != "task"})

    def to(self, dev: torch.device) -> "EvidenceBatch":
        """The same batch with every tensor on ``dev`` (itself when they are there already:
        batches are drawn on the CPU, then moved to the model's device)."""
        if self.items.device == dev:
            return self
        return replace(self, **{f.name: getattr(self, f.name).to(dev) for f in fields(self) if f.name != "task"})


class Gym:
    """Base class: subclasses implement :meth:`example` and :meth:`solve_one`."""

    name = "base"
    min_items = 1

    def __init__(self, vocab: int = 256, **params) -> None:
        self.vocab = vocab
        self.params = params

    def items_needed(self, n: int) -> int:
        """Symbols the gym may draw for a context of ``n`` items."""
        return n

    def check(self, max_items: int) -> None:
        if max_items < self.min_items:
            raise MasklabError(f"{self.name} needs at least {self.min_items} items, got {max_items}")
        need = self.items_needed(max_items) + 1
        if self.vocab < need:
            raise MasklabError(f"{self.name} with {max_items} items needs --vocab >= {need}, got {self.vocab}")

    def example(
        self, n: int, rng: np.random.Generator, **kw
    ) -> tuple[list[tuple[int, int]], tuple[int, int], int, list[int], int]:
        """One example: (items, query, answer, gold indices, hops)."""
        raise NotImplementedError

    def solve_one(self, items: list[tuple[int, int]], visible: list[bool], query: tuple[int, int], hops: int) -> int:
        """The answer derived from the visible items only (``-1``: undefined)."""
        raise NotImplementedError

    def sample(self, batch: int, n_items: int | tuple[int, int], rng: np.random.Generator, **kw) -> EvidenceBatch:
        """``batch`` fresh examples; ``n_items`` an int or an inclusive range ``(lo, hi)``
        (each example draws its own ``n``; the batch is padded to the longest)."""
        lo, hi = (n_items, n_items) if isinstance(n_items, int) else n_items
        self.check(hi)
        ns = rng.integers(max(lo, self.min_items), hi + 1, size=batch)
        width = int(ns.max())
        items = np.zeros((batch, width, N_FIELDS), dtype=np.int64)
        valid = np.zeros((batch, width), dtype=bool)
        gold = np.zeros((batch, width), dtype=bool)
        query = np.zeros((batch, N_FIELDS), dtype=np.int64)
        answer = np.zeros(batch, dtype=np.int64)
        hops = np.zeros(batch, dtype=np.int64)
        for b, n in enumerate(ns):
            its, q, a, g, h = self.example(int(n), rng, **kw)
            items[b, :n] = its
            valid[b, :n] = True
            gold[b, g] = True
            query[b], answer[b], hops[b] = q, a, h
        positions = np.broadcast_to(np.arange(1, width + 1), (batch, width)).copy()
        t = torch.from_numpy
        return EvidenceBatch(self.name, t(items), t(valid), t(positions), t(query), t(answer), t(gold), t(hops))

    def solve(self, batch: EvidenceBatch, keep: Tensor | None = None) -> Tensor:
        """``(B,)`` answers derived from the visible items (``valid & keep``), ``-1`` if undefined."""
        vis = batch.valid if keep is None else batch.valid & keep
        out = []
        for b in range(len(batch)):
            n = int(batch.valid[b].sum())
            its = [tuple(x) for x in batch.items[b, :n].tolist()]
            out.append(self.solve_one(its, vis[b, :n].tolist(), tuple(batch.query[b].tolist()), int(batch.hops[b])))
        return torch.tensor(out, dtype=torch.long)


GYMS: Registry[type[Gym]] = Registry("evidence task")
register = GYMS.register


def _symbols(rng: np.random.Generator, vocab: int) -> list[int]:
    """All symbols 1..vocab-1 in random order (draw disjoint symbols by popping)."""
    return (rng.permutation(vocab - 1) + 1).tolist()


@register("multihop")
class Multihop(Gym):
    """Follow ``hops`` pointer links from the query symbol (see the module docstring)."""

    def __init__(self, vocab: int = 256, hops: int = 2) -> None:
        if not 1 <= hops <= 4:
            raise MasklabError(f"--hops must be 1..4, got {hops}")
        super().__init__(vocab, hops=hops)
        self.hops = hops
        self.min_items = hops

    def items_needed(self, n: int) -> int:
        return 2 * n + 1  # each path of L links has L + 1 symbols; at least 1 link per path

    def _path(self, links: int, symbols: list[int]) -> list[int]:
        return [symbols.pop() for _ in range(links + 1)]

    def example(self, n, rng, max_hops: int | None = None, p_full: float = 1.0):
        """``max_hops``/``p_full`` (training curriculum): with probability ``1 - p_full`` the
        example has a random number of hops in ``1..max_hops`` instead of ``self.hops``."""
        h = self.hops
        if max_hops is not None and rng.random() >= p_full:
            h = int(rng.integers(1, min(max_hops, self.hops) + 1))
        if max_hops is not None:
            h = min(h, max_hops)
        symbols = _symbols(rng, self.vocab)
        pre, post = rng.random() < 0.5, rng.random() < 0.5
        pre = pre and n >= h + 1
        post = post and n >= h + 1 + pre
        nodes = self._path(h + pre + post, symbols)
        facts = [(nodes[i], nodes[i + 1]) for i in range(len(nodes) - 1)]
        start = nodes[int(pre)]
        gold_facts = facts[int(pre) : int(pre) + h]
        answer = nodes[int(pre) + h]
        while len(facts) < n:  # distractor paths of the same shape; the last one truncated
            links = h + (rng.random() < 0.5) + (rng.random() < 0.5)
            links = min(links, n - len(facts))
            d = self._path(links, symbols)
            facts += [(d[i], d[i + 1]) for i in range(links)]
        order = rng.permutation(n)
        items = [facts[i] for i in order]
        gold = [j for j, i in enumerate(order) if facts[i] in gold_facts]
        return items, (start, h), answer, gold, h  # the query states the number of hops

    def solve_one(self, items, visible, query, hops):
        succ = {a: b for (a, b), v in zip(items, visible) if v}
        node = query[0]
        for _ in range(hops):
            if node not in succ:
                return -1
            node = succ[node]
        return node


@register("stale")
class Stale(Gym):
    """The latest of ``updates`` assignments of the queried key (see the module docstring)."""

    def __init__(self, vocab: int = 256, updates: int = 2) -> None:
        if updates < 2:
            raise MasklabError(f"--updates must be >= 2, got {updates}")
        super().__init__(vocab, updates=updates)
        self.updates = updates
        self.min_items = updates

    def items_needed(self, n: int) -> int:
        return max(n, self.updates + 1)

    def example(self, n, rng, **kw):
        u = self.updates
        symbols = _symbols(rng, self.vocab)
        key = symbols.pop()
        values = rng.choice(np.arange(1, self.vocab), size=u, replace=False).tolist()
        facts = [(key, v) for v in values]
        while len(facts) < n:  # other keys, each assigned 1..u times
            k = symbols.pop()
            for _ in range(min(int(rng.integers(1, u + 1)), n - len(facts))):
                facts.append((k, int(rng.integers(1, self.vocab))))
        order = rng.permutation(n)
        items = [facts[i] for i in order]
        latest = max(j for j, i in enumerate(order) if i < u)
        return items, (key, PAD), items[latest][1], [latest], 0

    def solve_one(self, items, visible, query, hops):
        seen = [v for (k, v), vis in zip(items, visible) if vis and k == query[0]]
        return seen[-1] if seen else -1


@register("kv")
class KeyValue(Gym):
    """Single-hop retrieval: the queried key's value among distinct keys."""

    def example(self, n, rng, **kw):
        symbols = _symbols(rng, self.vocab)
        keys = [symbols.pop() for _ in range(n)]
        items = [(k, int(rng.integers(1, self.vocab))) for k in keys]
        j = int(rng.integers(n))
        return items, (items[j][0], PAD), items[j][1], [j], 0

    def solve_one(self, items, visible, query, hops):
        for (k, v), vis in zip(items, visible):
            if vis and k == query[0]:
                return v
        return -1


@register("aggregate")
class Aggregate(Gym):
    """Count the items tagged like the query (answer symbol = the count, 1..max_count)."""

    def __init__(self, vocab: int = 256, tags: int = 8, max_count: int = 4) -> None:
        if tags < 2 or max_count < 1:
            raise MasklabError("aggregate needs --tags >= 2 and --max-count >= 1")
        super().__init__(vocab, tags=tags, max_count=max_count)
        self.tags, self.max_count = tags, max_count
        self.min_items = max_count

    def items_needed(self, n: int) -> int:
        return max(self.tags, self.max_count) + 1  # tags 1..tags; values above them

    def example(self, n, rng, **kw):
        tag = int(rng.integers(1, self.tags + 1))
        count = int(rng.integers(1, min(self.max_count, n) + 1))
        others = [t for t in range(1, self.tags + 1) if t != tag]
        tags = [tag] * count + rng.choice(others, size=n - count).tolist()
        items = [(int(t), int(rng.integers(self.tags + 1, self.vocab))) for t in tags]
        order = rng.permutation(n)
        items = [items[i] for i in order]
        gold = [j for j, i in enumerate(order) if i < count]
        return items, (tag, PAD), count, gold, 0

    def solve_one(self, items, visible, query, hops):
        return sum(1 for (t, _), vis in zip(items, visible) if vis and t == query[0])


def make_gym(task: str, vocab: int = 256, hops: int = 2, updates: int = 2, tags: int = 8, max_count: int = 4) -> Gym:
    """Build a gym by name with its own parameters (others are ignored)."""
    GYMS[task]  # an unknown name fails here with the list of tasks
    if task == "multihop":
        return Multihop(vocab, hops)
    if task == "stale":
        return Stale(vocab, updates)
    if task == "aggregate":
        return Aggregate(vocab, tags, max_count)
    return GYMS[task](vocab)
