"""The router base class, its registry and :func:`load_router`.

A router scores the units of a document for a question; :func:`~masklab.text.selection.select`
keeps the best within a token budget. A new router is one small registered class with one
method to override (as a kvpress press overrides ``score``)::

    @ROUTERS.register("longest")
    class Longest(Router):
        def score(self, doc, question):
            return torch.tensor(doc.lengths(self.tokenizer), dtype=torch.float32)

Every router is registered by importing :mod:`masklab.context.routers`, which also holds
:func:`~masklab.context.routers.load_router`. ``Router.prune(text, question, keep)`` segments a text (or takes a :class:`Document`),
scores it, selects and returns a :class:`Pruned`; ``Router.press(question, keep)`` wraps
the same choice as a kvpress press that deletes the other units' tokens before prefill.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from masklab.text.document import UNIT_TOKENS, Document, segment
from masklab.text.selection import AUTO, auto_fraction, check_keep, select
from masklab.util.errors import MasklabError
from masklab.util.registry import Registry

ROUTERS: Registry = Registry("router")
# The router of compress, serve and the integrations when none is named: the best pooled val MRR of the real-document
# benchmark, kept only if it is not below bm25 on either test split (docs/context.md): dense until the LoRA pruner,
# the LoRA pruner until the context pruner (val MRR, results/ctx/results.json).
DEFAULT_ROUTER = "pruner-ctx"


@dataclass
class Pruned:
    """What a router kept of a document: ``kept`` unit indices (ascending), every unit's
    ``scores``, the pruned ``text`` (kept units in reading order), ``kept_fraction`` of the
    context's tokens, the router's ``seconds`` (segmenting excluded) and ``notes`` on what
    happened (windows, a budget capped to fit the model). A compressor that rewrites the
    text instead of keeping units sets ``compressed`` (the text) and ``compressed_tokens``."""

    doc: Document
    kept: list[int]
    scores: list[float]
    lengths: list[int]
    seconds: float
    router: str
    notes: list[str] = field(default_factory=list)
    compressed: str | None = None  # a compressor that rewrites the text (LongLLMLingua) keeps no units
    compressed_tokens: int | None = None

    @property
    def text(self) -> str:
        return self.compressed if self.compressed is not None else self.doc.text_of(self.kept)

    @property
    def kept_tokens(self) -> int:
        return self.compressed_tokens if self.compressed is not None else sum(self.lengths[i] for i in self.kept)

    @property
    def kept_fraction(self) -> float:
        return self.kept_tokens / max(1, sum(self.lengths))

    def to_json(self) -> dict:
        """Everything above; ``origin_tokens`` / ``compressed_tokens`` (the document's tokens and
        the kept ones) and their ``ratio`` as :class:`~masklab.context.passages.PrunedPassages` has them."""
        units = self.compressed is None
        return {"router": self.router, "units": self.doc.units, "kept": self.kept if units else None,
                "scores": self.scores if units else None,
                "unit_tokens": self.lengths, "pruned_text": self.text, "kept_fraction": self.kept_fraction,
                "origin_tokens": sum(self.lengths), "compressed_tokens": self.kept_tokens,
                "ratio": sum(self.lengths) / max(1, self.kept_tokens),
                "router_seconds": self.seconds, "notes": self.notes}


class Router:
    """Scores units for a question. ``lm``: the :class:`~masklab.pretrained.models.LoadedModel`
    whose tokenizer counts tokens (and whose layers a trained router reads); None counts
    words. ``fill``: the default of :meth:`prune` (True: fill the budget)."""

    name = ""
    needs_model = False
    fill = True
    use = ""  # which documents it is for (one line in `masklab compress --list-routers`)
    keep_auto: float | None = None  # the score from which keep="auto" keeps a unit (routers that decide how much)
    keep_rule = "threshold"  # how keep_auto cuts (selection.KEEP_RULES): a score, or a share of the best unit's score
    context = 0  # units on each side of the best unit kept right after it (selection.select)
    hops = 1  # 2: score again with the question and the best unit's text (score_hops)
    last_windows = 1  # how many windows the last score() read (a trained router reads a long document in several)
    score_range: tuple[float, float] | None = None  # the bounds of the scores (where a threshold may lie), if any

    def __init__(self, lm=None) -> None:
        if self.needs_model and lm is None:
            raise MasklabError(f"the {self.name} router reads a language model: give one (--model / model=...)")
        self.lm = lm
        self.notes: list[str] = []  # what a user should know about this router's choices (Pruned.notes)

    @property
    def tokenizer(self):
        return None if self.lm is None else self.lm.tokenizer

    def score(self, doc: Document, question: str) -> Tensor:
        """``(N,)``: one score per unit of ``doc``, higher = keep first."""
        raise NotImplementedError

    def checked_score(self, doc: Document, question: str) -> Tensor:
        """:meth:`score_hops` of one question, refused unless it gives one score per unit (what every caller reads)."""
        return self.checked(doc, self.score_hops(doc, [question])[0])

    def checked(self, doc: Document, scores: Tensor) -> Tensor:
        """``scores``, refused unless there is one per unit of ``doc``."""
        if scores.shape != (len(doc.units),):
            raise MasklabError(f"router {self.name!r} returned scores of shape {tuple(scores.shape)} "
                               f"for {len(doc.units)} units; expected ({len(doc.units)},)")
        return scores

    def score_many(self, doc: Document, questions: list[str]) -> list[Tensor]:
        """One ``(N,)`` score vector per question over ``doc``: :meth:`score` for each (a router
        that reads several questions in one batch overrides this for speed, same scores)."""
        return [self.score(doc, q) for q in questions]

    def score_hops(self, doc: Document, questions: list[str]) -> list[Tensor]:
        """:meth:`score_many`, then where :attr:`hops` is 2 a second hop: each question again, followed by
        the text of its best unit, and each unit's higher score of the two (a unit that explains what the
        best unit names can rise though it shares no word with the question)."""
        first = self.score_many(doc, questions)
        if self.hops < 2 or len(doc.units) < 2:
            return first
        again = self.score_many(doc, [f"{q} {doc.units[int(s.argmax())]}" for q, s in zip(questions, first)])
        return [torch.maximum(a, b) for a, b in zip(first, again)]

    @classmethod
    def check_range(cls, threshold: float) -> None:
        """A ``threshold`` needs a router whose scores have a range (one that decides how much
        to keep), and a number within it."""
        if cls.score_range is None:
            raise MasklabError(f"a threshold needs a router that decides how much to keep (pruner, pruner-ctx); "
                               f"{cls.name} does not: give a fraction")
        lo, hi = cls.score_range
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not lo <= threshold <= hi:
            raise MasklabError(f"the threshold of {cls.name} must be a number in [{lo:g}, {hi:g}] (its scores' range), "
                               f"got {threshold!r}")

    def check_threshold(self, threshold: float | None) -> None:
        """:meth:`check_range` where a ``threshold`` is given."""
        if threshold is not None:
            self.check_range(threshold)

    def resolve_keep(self, keep: float | str, scores: Tensor, lengths: list[int], threshold: float | None = None,
                     within: int | None = None) -> float:
        """``keep`` as a fraction: :data:`~masklab.text.selection.AUTO` (or a ``threshold``) becomes the
        share of the tokens in the units :attr:`keep_auto` keeps by :attr:`keep_rule` (or scoring at least
        ``threshold``), with the :attr:`context` units around the best one (``within``: as
        :func:`~masklab.text.selection.select`)."""
        if threshold is not None:
            return auto_fraction(scores, lengths, threshold, context=self.context, within=within)
        if keep != AUTO:
            return keep
        if self.keep_auto is None:
            raise MasklabError(f"keep auto needs a router that decides how much to keep (pruner); {self.name} "
                               "does not: give a fraction")
        return auto_fraction(scores, lengths, self.keep_auto, self.keep_rule, self.context, within)

    def choose(self, doc: Document, question: str, keep: float | str, fill: bool | None = None,
               limit: int | None = None, threshold: float | None = None) -> Pruned:
        """Score ``doc`` and keep its best units within ``keep`` of its tokens (and ``limit``);
        ``threshold``: instead, every unit scoring at least it (the top unit always). The same
        for every router (no router overrides it): a router differs only in ``score``."""
        return self.choose_many(doc, [question], keep, fill, limit, threshold)[0]

    def choose_many(self, doc: Document, questions: list[str], keep: float | str, fill: bool | None = None,
                    limit: int | None = None, threshold: float | None = None) -> list[Pruned]:
        """:meth:`choose` for each of ``questions`` over one ``doc``, scored by :meth:`score_many`
        (``seconds``: each question's share of the scoring)."""
        check_keep(keep)
        self.check_threshold(threshold)
        if keep == AUTO:
            self.resolve_keep(keep, torch.zeros(1), [1])  # a router that cannot: refused before scoring
        if not doc.units:
            raise MasklabError("the document has no units to keep")
        lengths = doc.lengths(self.tokenizer)
        t0 = time.perf_counter()
        many = self.score_hops(doc, questions)
        seconds = (time.perf_counter() - t0) / max(1, len(questions))
        out = []
        for scores in many:
            fraction = self.resolve_keep(keep, self.checked(doc, scores), lengths, threshold)
            kept = select(scores, lengths, fraction, fill=(self.fill if fill is None else fill) and threshold is None,
                          limit=limit, context=self.context)
            out.append(Pruned(doc, kept, [float(s) for s in scores], lengths, seconds, self.name, list(self.notes)))
        return out

    def prune(self, text: str | Document, question: str, keep: float = 0.25, fill: bool | None = None,
              unit_tokens: int = UNIT_TOKENS, limit: int | None = None, threshold: float | None = None) -> Pruned:
        """``text`` (cut by :func:`~masklab.text.document.segment`) or a :class:`Document`,
        pruned to ``keep`` of its tokens for ``question`` (or to the units scoring at least
        ``threshold``, for a router that decides how much to keep)."""
        return self.prune_many([(question, text)], keep, fill, unit_tokens, limit, threshold)[0]

    def prune_many(self, pairs: list[tuple[str, str | Document]], keep: float = 0.25, fill: bool | None = None,
                   unit_tokens: int = UNIT_TOKENS, limit: int | None = None,
                   threshold: float | None = None) -> list[Pruned]:
        """:meth:`prune` for each ``(question, text)`` of ``pairs``, in order; the questions on
        one text are scored together (:meth:`score_many`: one batch for a cross-encoder)."""
        from masklab.text.inputs import check_question

        groups: dict[int, tuple[Document, list[int]]] = {}
        docs: dict[str, Document] = {}
        for k, (question, text) in enumerate(pairs):
            check_question(question)
            if isinstance(text, Document):
                doc = text
            else:
                if text not in docs:
                    docs[text] = segment(text, self.tokenizer, unit_tokens)
                doc = docs[text]
            groups.setdefault(id(doc), (doc, []))[1].append(k)
        out: list[Pruned | None] = [None] * len(pairs)
        for doc, ks in groups.values():
            qs = [check_question(pairs[k][0]) for k in ks]
            for k, pruned in zip(ks, self.choose_many(doc, qs, keep, fill, limit, threshold)):
                out[k] = pruned
        return out

    def press(self, question: str, keep: float = 0.25, fill: bool | None = None):
        """A kvpress press that prefills only the units this router keeps of the context the
        pipeline is given (:class:`masklab.context.press.ContextPress`)."""
        from masklab.context.press import ContextPress

        check_keep(keep)
        if self.lm is None:
            raise MasklabError("a press needs the model's tokenizer: load the router with model=...")
        return ContextPress(router=self, question=question, keep=keep, fill=fill)
