"""Several passages pruned for one question within one budget (LLMLingua's
``compress_prompt(context=[...], question, rate, target_token)`` is the model of this API).

    from masklab.context import compress_passages, load_router
    router = load_router("bm25", "smollm2-135m")      # tokens counted with the model's tokenizer
    out = compress_passages(["passage one ...", "passage two ..."], "Who approved the budget?",
                            router, target_tokens=300)
    out.text, out.texts, out.origin_tokens, out.compressed_tokens, out.ratio, out.to_json()

The budget is ``keep`` (a fraction of all the passages' tokens) or ``target_tokens`` (at most
that many tokens kept, counted with the router's tokenizer: the answering model's when the
router was loaded with it, else words and punctuation marks); ``target_tokens`` wins when
both are given, and neither means ``keep=0.25``; ``keep="auto"`` or a ``threshold`` lets a router
that decides how much (``pruner-ctx``, ``pruner``) keep every unit scoring at least its val threshold
or the one given, over all the passages. It is spent across the passages:

* coarse: the router scores every unit of every passage in one call (the passages' units as
  one document, so a score means the same in every passage: BM25's idf, for one, is taken
  over all of them) and the passages are ranked by their best unit's score (ties: the
  earlier passage);
* fine: :func:`~masklab.text.selection.select` keeps units best first within the budget
  over all passages, the ranked passages' units in rank order so that a tie goes to the
  better passage. The top unit of the top passage is always kept, even where it alone is
  over the budget (a note says so).

The kept text of each passage that keeps anything is joined with a blank line, in the
passages' original order (:attr:`PrunedPassages.text`; :attr:`PrunedPassages.texts` has
one string per passage, empty where nothing was kept). Anything but a
:class:`~masklab.context.router.Router` (a kvpress press keeps no units) is refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from masklab.text.document import UNIT_TOKENS, Document, segment
from masklab.context.router import Router
from masklab.text.selection import AUTO, check_keep, select
from masklab.util.errors import MasklabError

DEFAULT_KEEP = 0.25


@dataclass
class PrunedPassages:
    """What a router kept of several passages: per passage its :class:`Document` (``docs``),
    the ``kept`` unit indices (ascending), every unit's ``scores`` and token ``lengths``;
    ``rank``: the passage indices, best first (coarse ranking); the router's ``seconds``
    (segmenting excluded), the budget asked for and ``notes`` on what happened."""

    docs: list[Document]
    kept: list[list[int]]
    scores: list[list[float]]
    lengths: list[list[int]]
    rank: list[int]
    seconds: float
    router: str
    keep: float | None = None
    target_tokens: int | None = None
    threshold: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def texts(self) -> list[str]:
        """Each passage's kept text (units in reading order), ``""`` where none was kept."""
        return [doc.text_of(k) if k else "" for doc, k in zip(self.docs, self.kept)]

    @property
    def text(self) -> str:
        """The kept text of every passage that keeps anything, in order, blank-line separated."""
        return "\n\n".join(t for t in self.texts if t)

    @property
    def origin_tokens(self) -> int:
        return sum(sum(n) for n in self.lengths)

    @property
    def compressed_tokens(self) -> int:
        return sum(n[i] for n, k in zip(self.lengths, self.kept) for i in k)

    @property
    def ratio(self) -> float:
        """``origin_tokens / compressed_tokens`` (LLMLingua's ratio, as a number)."""
        return self.origin_tokens / max(1, self.compressed_tokens)

    @property
    def kept_fraction(self) -> float:
        return self.compressed_tokens / max(1, self.origin_tokens)

    def to_json(self) -> dict:
        ranks = {p: r for r, p in enumerate(self.rank)}
        return {"router": self.router, "keep": self.keep, "target_tokens": self.target_tokens,
                **({"threshold": self.threshold} if self.threshold is not None else {}),
                "origin_tokens": self.origin_tokens, "compressed_tokens": self.compressed_tokens,
                "ratio": self.ratio, "kept_fraction": self.kept_fraction, "pruned_text": self.text,
                "router_seconds": self.seconds, "notes": self.notes,
                "passages": [{"index": p, "rank": ranks[p], "units": len(doc.units), "kept_units": len(k),
                              "tokens": sum(n), "kept_tokens": sum(n[i] for i in k), "kept": k, "text": t}
                             for p, (doc, k, n, t) in enumerate(zip(self.docs, self.kept, self.lengths, self.texts))]}


def check_target(target_tokens) -> int:
    """``target_tokens`` must be a whole number of tokens, at least 1."""
    if isinstance(target_tokens, bool) or not isinstance(target_tokens, int):
        raise MasklabError(f"target_tokens must be a whole number of tokens, got {target_tokens!r}")
    if target_tokens < 1:
        raise MasklabError(f"target_tokens must be at least 1, got {target_tokens}")
    return target_tokens


def compress_passages(passages: list[str], question: str, router, keep: float | None = None,
                      target_tokens: int | None = None, unit_tokens=UNIT_TOKENS, fill=None, *,
                      limit: int | None = None, threshold: float | None = None) -> PrunedPassages:
    """``passages`` pruned for ``question`` by ``router`` (a :class:`Router`, or a router name
    for :func:`~masklab.context.routers.load_router` without a model) within one budget:
    ``keep`` of all their tokens or at most ``target_tokens`` tokens (module docstring).
    ``unit_tokens``: the longest unit (:func:`~masklab.text.document.segment`); ``fill``:
    as :meth:`Router.choose` (None: the router's default); ``limit``: a further cap in tokens
    (the CLI's model window); ``threshold``: instead of ``keep``, every unit scoring at least it
    (a router that decides how much; the top unit always)."""
    from masklab.text.inputs import check_question

    if isinstance(router, str):
        from masklab.context.routers import load_router

        router = load_router(router)
    if not isinstance(router, Router):
        raise MasklabError(f"router must be a Router or a router name, got {type(router).__name__}")
    if isinstance(passages, str) or not isinstance(passages, (list, tuple)) or not passages:
        raise MasklabError("passages must be a non-empty list of strings")
    for i, p in enumerate(passages):
        if not isinstance(p, str):
            raise MasklabError(f"passage {i} is a {type(p).__name__}, not a string")
        if not p.strip():
            raise MasklabError(f"passage {i} is empty")
    question = check_question(question)
    if target_tokens is not None:
        target_tokens = check_target(target_tokens)
        if threshold is not None:
            raise MasklabError("threshold and target_tokens each set the budget: give one")
    router.check_threshold(threshold)
    keep = check_keep(DEFAULT_KEEP if keep is None else keep)
    docs = [segment(p, router.tokenizer, unit_tokens) for p in passages]
    lengths = [doc.lengths(router.tokenizer) for doc in docs]
    t0 = time.perf_counter()
    scores = router.checked_score(Document(units=[u for d in docs for u in d.units]), question)  # one call for all
    starts = [0]
    for d in docs:
        starts.append(starts[-1] + len(d.units))
    per = [scores[a:b] for a, b in zip(starts, starts[1:])]
    rank = sorted(range(len(docs)), key=lambda p: (-float(per[p].max()), p))
    order = [(p, i) for p in rank for i in range(len(docs[p].units))]  # units of the best passage first
    ordered, ordered_lengths = torch.stack([per[p][i] for p, i in order]), [lengths[p][i] for p, i in order]
    within = len(docs[rank[0]].units)  # the top unit's neighbours are its own passage's
    budget_keep, cap = (1.0, target_tokens) if target_tokens is not None else (keep, None)
    if budget_keep == AUTO or threshold is not None:
        budget_keep = router.resolve_keep(budget_keep, ordered, ordered_lengths, threshold, within)
    if limit is not None:
        cap = limit if cap is None else min(cap, limit)
    chosen = select(ordered, ordered_lengths, budget_keep, fill=(router.fill if fill is None else fill) and threshold is None,
                    limit=cap, context=router.context, within=within)
    seconds = time.perf_counter() - t0
    kept: list[list[int]] = [[] for _ in docs]
    for j in chosen:
        p, i = order[j]
        kept[p].append(i)
    out = PrunedPassages(docs, [sorted(k) for k in kept], [[float(s) for s in x] for x in per], lengths, rank,
                         seconds, router.name, keep=None if target_tokens is not None else keep,
                         target_tokens=target_tokens, threshold=threshold)
    budget = target_tokens if target_tokens is not None else budget_keep * out.origin_tokens
    if out.compressed_tokens > budget and len(chosen) == 1:
        out.notes.append(f"the top unit alone is {out.compressed_tokens} tokens, over the budget of "
                         f"{budget:.0f}: it is kept anyway (the top unit is always kept)")
    return out
