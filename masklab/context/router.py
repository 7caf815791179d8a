"""The router base class, its registry, the one request and the one result.

A router scores the units of a document for a question; :func:`~masklab.text.selection.select`
keeps the best within a token budget. A new router is one small registered class with one
method to override (as a kvpress press overrides ``score``)::

    @ROUTERS.register("longest")
    class Longest(Router):
        def score(self, doc, question):
            return torch.tensor(doc.lengths(self.tokenizer), dtype=torch.float32)

Every router is registered by importing :mod:`masklab.context.routers`, which also holds
:func:`~masklab.context.routers.load_router`.

One request, one result: every front end (``masklab compress``, ``masklab serve``,
:func:`masklab.context.prune`, the LangChain and LlamaIndex adapters) builds a :class:`Request`
and renders the :class:`Pruned` that ``Router.prune(request)`` returns::

    router = load_router("bm25")
    out = router.prune(Request("Who approved the budget?", [text], fraction=0.25))
    out.text, out.kept, out.scores, out.to_json()

A :class:`Request` is a question, its passages (one document is one passage) and one budget:
exactly one of ``fraction`` (of the passages' tokens), ``tokens`` (at most that many),
``threshold`` (every unit scoring at least it) or ``auto`` (the router's own rule); none
means ``fraction=0.25``. It is checked once, when it is made, against what its router declares
(:class:`Router`'s fields ``score_range``, ``options`` and :meth:`Router.capabilities`); a front end
that narrows it (the window's cap, a cut document, the query) uses :meth:`Request.with_`, which
checks only the field it changes. Adding a budget mode or an option touches :class:`Request` and
:func:`select_units`, which reads it.
``Router.press(question, keep)`` wraps the same choice as a kvpress press that deletes the other
units' tokens before prefill.
"""

from __future__ import annotations

import copy
import importlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from masklab.text.document import UNIT_TOKENS, Document, segment
from masklab.text.inputs import check_context, check_question
from masklab.text.selection import AUTO, auto_fraction, check_keep, select
from masklab.util.errors import MasklabError, unknown
from masklab.util.registry import Registry

if TYPE_CHECKING:  # torch loads when a router first scores, not when a command parses its flags
    from torch import Tensor

ROUTERS: Registry = Registry("router")
# The router of compress, serve and the integrations when none is named: the best pooled val MRR of the real-document
# benchmark, kept only if it is not below bm25 on either test split (docs/context.md): dense until the LoRA pruner,
# the LoRA pruner until the context pruner (val MRR, results/ctx/results.json), the context pruner until the passage
# pruner (val MRR on the corpus's val questions, results/passage-marks/results.json; test reads in
# results/realdocs-passage-smollm2-135m).
DEFAULT_ROUTER = "pruner-passage"
DEFAULT_KEEP = 0.25  # the fraction kept when a request sets no budget
BUDGETS = ("fraction", "tokens", "threshold", "auto")
# how each field is named to a Python caller; the CLI passes its flags (``names=``) so its messages name them
PYTHON_NAMES = {
    "fraction": "keep",
    "tokens": "target_tokens",
    "threshold": "threshold",
    "auto": "keep auto",
    "path": "path",
    "int8": "int8",
    "embedder": "embedder",
    "router_model": "router_model",
}
# what each router option is for, in its refusal (a router declares the options it takes: Router.options)
OPTION_USE = {
    "path": "is for the trained routers",
    "int8": "quantises the pruner's encoder",
    "embedder": "is for the routers that embed sentences",
    "router_model": "is for the trained routers",
}
SOFT_OPTIONS = ("progress",)  # given to the routers that take them, never refused
# what a router's weights file (its JSON) may carry -> the Router field it sets (read in one place: Router.capabilities)
CAPABILITY_KEYS = {"keep_auto": "keep_auto", "keep_rule": "keep_rule", "context": "neighbours", "hops": "hops"}


def registered() -> None:
    """:data:`ROUTERS` filled: each product router registers itself when its file in
    ``masklab.context.routers`` is imported, and those files import this module, so the package
    is loaded on demand, by name, the first time a router is looked up (importing a submodule of
    ``masklab.context`` loads no router, and no torch)."""
    importlib.import_module("masklab.context.routers")


def router_class(router: str | type):
    """The class of product router ``router`` (a name of :data:`~masklab.context.router.ROUTERS`;
    a kvpress press, which keeps no units, declares no option and no score range), or ``router``
    itself (a class, e.g. one of the lab's). An unknown name is refused with every name
    ``masklab compress --list-routers`` shows, read from the registries."""
    if not isinstance(router, str):
        return router
    registered()
    from masklab.context.presses import PRESSES

    if router in PRESSES:
        return _press_class(router)
    if router not in ROUTERS:
        raise unknown("router", router, [*ROUTERS, *PRESSES], " (the presses only with --answer)")
    return ROUTERS[router]


@lru_cache(maxsize=None)
def _press_class(name: str) -> type:
    """A kvpress press as a request sees it: a router that declares nothing (it keeps no units)."""
    return type(name, (Router,), {"name": name, "use": "a KV-cache press"})


@lru_cache(maxsize=16)
def weights_meta(path: str) -> Mapping[str, Any]:
    """The JSON beside weights file ``path`` (``{}`` where there is none), read once per process."""
    meta = Path(path).with_suffix(".json")
    return json.loads(meta.read_text()) if meta.is_file() else {}


def takers(option: str) -> list[str]:
    """The product routers that declare ``option`` (``score_range``: those that decide how much)."""
    registered()
    if option == "score_range":
        return [n for n in ROUTERS if ROUTERS[n].score_range is not None]
    return [n for n in ROUTERS if option in ROUTERS[n].options]


def router_options(cls: type, options: Mapping[str, Any], names: Mapping[str, str] = PYTHON_NAMES) -> dict:
    """The keyword options router class ``cls`` is built with: every given one (not None or
    False), each refused unless ``cls`` declares it, except :data:`SOFT_OPTIONS`, given only where
    declared; an ``embedder`` must be a sentence-transformers folder."""
    out = {}
    for key, value in options.items():
        if value is None or value is False:
            continue
        if key not in cls.options:
            if key in SOFT_OPTIONS:
                continue
            raise MasklabError(
                f"{names.get(key, key)} {OPTION_USE.get(key, 'is not an option of')} "
                f"({', '.join(takers(key))}), not {cls.name}"
            )
        if key == "embedder":
            from masklab.context.embedder import check_folder

            check_folder(value)
        out[key] = value
    return out


@dataclass(frozen=True)
class Request:
    """A ``question`` on ``passages`` (a string or :class:`Document`, or a list of them: one
    budget over all), the budget (module docstring), ``fill`` (None: the router's default),
    ``cap`` (at most this many tokens kept whatever the budget, e.g. the model's window; ``fits``
    says what it fits, in the note when it caps), the router's ``options`` (``path``, ``int8``,
    ``embedder``, ``router_model``, ``progress``) and ``unit_tokens`` (the longest unit).
    ``router``: the router name (or class) it is checked against; ``names``: how the fields are
    named in its messages (the CLI's flags); ``sources``: each passage's name (its file), in the
    result's rows; ``max_bytes``: the most UTF-8 bytes of every passage together (``size``: theirs,
    counted once when it is made).

    Every field is checked once, in ``__post_init__``; :meth:`with_` narrows a checked request."""

    question: str
    passages: Sequence[str | Document]
    fraction: float | None = None
    tokens: int | None = None
    threshold: float | None = None
    auto: bool = False
    fill: bool | None = None
    cap: int | None = None
    fits: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    unit_tokens: int = UNIT_TOKENS
    router: str | type = ""
    names: Mapping[str, str] = field(default_factory=lambda: PYTHON_NAMES, repr=False, compare=False)
    sources: Sequence[str] = ()
    max_bytes: float = float("inf")
    size: int = field(default=0, init=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "question", check_question(self.question))
        passages, size = passages_of(self.passages, self.max_bytes)
        set_(self, "passages", passages)
        set_(self, "size", size)
        set_(self, "sources", tuple(self.sources))
        if self.sources and len(self.sources) != len(self.passages):
            raise MasklabError(f"{len(self.sources)} passage names for {len(self.passages)} passages")
        set_(self, "router", self.router or DEFAULT_ROUTER)
        cls = router_class(self.router)
        given = self.budgets()
        if len(given) > 1:
            raise MasklabError(f"{self.names[given[-1]]} and {self.names[given[-2]]} each set the budget: give one")
        if not given:
            set_(self, "fraction", DEFAULT_KEEP)
        if self.fraction is not None:
            check_keep(self.fraction)
        if self.tokens is not None and (isinstance(self.tokens, bool) or not isinstance(self.tokens, int)):
            raise MasklabError(f"{self.names['tokens']} must be a whole number of tokens, got {self.tokens!r}")
        if self.tokens is not None and self.tokens < 1:
            raise MasklabError(f"{self.names['tokens']} must be at least 1, got {self.tokens}")
        path = self.options.get("path")
        keep_auto = cls.capabilities(path)["keep_auto"] if self.auto else None
        if self.auto and keep_auto is None and cls.weights_file(path) is not None:
            raise MasklabError(
                f"{self.names['auto']} needs the router's own rule, and {cls.weights_file(path)} carries none "
                "(no keep_auto in its JSON): give a fraction or a threshold"
            )
        decides = cls.score_range is not None or keep_auto is not None
        if (self.threshold is not None and cls.score_range is None) or (self.auto and not decides):
            what = self.names["threshold" if self.threshold is not None else "auto"]
            deciders = ", ".join(takers("score_range"))
            raise MasklabError(
                f"{what} needs a router that decides how much to keep ({deciders}); {cls.name} does "
                "not: give a fraction"
            )
        if self.threshold is not None:
            lo, hi = cls.score_range
            t = self.threshold
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not lo <= t <= hi:
                raise MasklabError(
                    f"the threshold of {cls.name} must be a number in [{lo:g}, {hi:g}] (its scores' range), got {t!r}"
                )
        if isinstance(self.unit_tokens, bool) or not isinstance(self.unit_tokens, int) or self.unit_tokens < 1:
            raise MasklabError(f"unit_tokens must be a whole number >= 1, got {self.unit_tokens!r}")
        router_options(cls, self.options, self.names)

    @classmethod
    def of(
        cls,
        question: str,
        passages,
        keep: float | str | None = None,
        target_tokens: int | None = None,
        threshold: float | None = None,
        **rest,
    ) -> Request:
        """The request of the front ends' ``keep`` / ``target_tokens`` / ``threshold``:
        ``target_tokens`` or ``threshold`` wins over ``keep`` (a fraction, or ``"auto"``), and
        ``target_tokens`` with ``threshold`` is refused."""
        if target_tokens is not None or threshold is not None:
            keep = None
        return cls(
            question,
            passages,
            fraction=None if keep in (None, AUTO) else keep,
            tokens=target_tokens,
            threshold=threshold,
            auto=keep == AUTO,
            **rest,
        )

    def with_(self, **changes) -> Request:
        """This request with ``changes`` to ``question``, ``passages`` (and their ``sources``), ``cap``
        or ``fits``, each checked alone: the rest was checked when the request was made."""
        out = copy.copy(self)
        set_ = object.__setattr__
        for key, value in changes.items():
            if key == "question":
                value = check_question(value)
            elif key == "passages":
                value, size = passages_of(value, self.max_bytes)
                set_(out, "size", size)
                if "sources" not in changes:
                    set_(out, "sources", ())
            elif key == "sources":
                value = tuple(value)
            elif key == "cap":
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    raise MasklabError(f"cap must be a whole number of tokens, got {value!r}")
            elif key != "fits":
                raise TypeError(f"Request.with_ narrows question, passages, sources, cap or fits, not {key}")
            set_(out, key, value)
        if out.sources and len(out.sources) != len(out.passages):
            raise MasklabError(f"{len(out.sources)} passage names for {len(out.passages)} passages")
        return out

    @property
    def decides(self) -> bool:
        """Whether the router decides how much to keep (a threshold, or its own rule)."""
        return self.auto or self.threshold is not None

    @property
    def keep(self) -> float | str | None:
        """The budget as a ``keep`` (a fraction or ``"auto"``; None for tokens or a threshold)."""
        return AUTO if self.auto else self.fraction

    def budgets(self) -> list[str]:
        """The budget fields set (``auto`` when true, the others when not None: a threshold may be 0)."""
        return [b for b in BUDGETS if (self.auto if b == "auto" else getattr(self, b) is not None)]

    def budget_text(self) -> str:
        """The budget as the caller gave it: ``--keep 0.25``, ``--target-tokens 40``, ..."""
        b = self.budgets()[0]
        return self.names[b] if b == "auto" else f"{self.names[b]} {getattr(self, b)}"


def passages_of(passages, max_bytes: float = float("inf")) -> tuple[tuple, int]:
    """``(passages as a tuple, their size in UTF-8 bytes)``: one string or :class:`Document` is one
    passage; a list must be non-empty, of strings (each a text:
    :func:`~masklab.text.inputs.check_context`, within ``max_bytes``, and all of them together) or
    documents (their size is not counted)."""
    if isinstance(passages, (str, Document)):
        passages = [passages]
    if not isinstance(passages, (list, tuple)) or not passages:
        raise MasklabError("passages must be a non-empty list of strings")
    size = 0
    for i, p in enumerate(passages):
        if isinstance(p, Document):
            if not p.units:
                raise MasklabError("the document has no units to keep")
            continue
        if not isinstance(p, str):
            raise MasklabError(f"passage {i} is a {type(p).__name__}, not a string")
        what = "the context" if len(passages) == 1 else f"passage {i} of the context"
        size += check_context(p, what, max_bytes)
    if size > max_bytes:
        raise MasklabError(f"the context is {size:,} bytes, over the limit of {max_bytes:,}")
    return tuple(passages), size


@dataclass
class Pruned:
    """What a router kept for one request, the one result every front end renders:
    ``doc`` (the passages' units as one document; the document itself for one passage),
    ``kept`` unit indices of ``doc`` (ascending), every unit's ``scores`` and token ``lengths``,
    the router's ``seconds`` (segmenting excluded) and ``notes`` on what happened (windows, a
    capped budget, a top unit over the budget); ``passages``: each passage's :class:`Document`,
    ``rank``: the passages best first (by their best unit). A compressor that rewrites the text
    instead of keeping units (the lab's LongLLMLingua) sets ``compressed`` and ``compressed_tokens``;
    a kvpress press, which keeps every unit and drops key/value pairs inside the model, sets
    ``cache_fraction`` (the share of the pairs it keeps) and keeps no text. ``neighbours``,
    ``keep_auto`` and ``keep_rule``: the router's rule that chose them (:meth:`Router.capabilities`),
    for a reader who asks why a unit was kept."""

    doc: Document
    kept: list[int]
    scores: list[float]
    lengths: list[int]
    seconds: float
    router: str
    notes: list[str] = field(default_factory=list)
    compressed: str | None = None
    compressed_tokens: int | None = None
    passages: list[Document] | None = None
    rank: list[int] = field(default_factory=lambda: [0])
    request: Request | None = None
    cache_fraction: float | None = None
    neighbours: int = 0
    keep_auto: float | None = None
    keep_rule: str = "threshold"

    @property
    def docs(self) -> list[Document]:
        return self.passages or [self.doc]

    @property
    def starts(self) -> list[int]:
        """Where each passage's units start in :attr:`doc`, and the end."""
        out = [0]
        for d in self.docs:
            out.append(out[-1] + len(d.units))
        return out

    @property
    def passage_kept(self) -> list[list[int]]:
        """Each passage's kept unit indices (its own numbering)."""
        return [[i - a for i in self.kept if a <= i < b] for a, b in zip(self.starts, self.starts[1:])]

    @property
    def texts(self) -> list[str]:
        """Each passage's kept text (units in reading order), ``""`` where none was kept."""
        return [d.text_of(k) if k else "" for d, k in zip(self.docs, self.passage_kept)]

    @property
    def text(self) -> str | None:
        """The kept text of every passage that keeps anything, in order, blank-line separated
        (None for a press: it keeps no text)."""
        if self.cache_fraction is not None:
            return None
        if self.compressed is not None:
            return self.compressed
        return "\n\n".join(t for t in self.texts if t)

    @property
    def sources(self) -> list[str | int]:
        """Each passage's name (its file, from :attr:`Request.sources`), or its index where it has none."""
        names = () if self.request is None else self.request.sources
        return list(names) if len(names) == len(self.docs) else list(range(len(self.docs)))

    @property
    def origin_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def kept_tokens(self) -> int:
        if self.cache_fraction is not None:
            return round(self.cache_fraction * self.origin_tokens)
        return self.compressed_tokens if self.compressed is not None else sum(self.lengths[i] for i in self.kept)

    @property
    def kept_fraction(self) -> float:
        if self.cache_fraction is not None:
            return self.cache_fraction
        return self.kept_tokens / max(1, sum(self.lengths))

    @property
    def ratio(self) -> float:
        """``origin_tokens / compressed_tokens`` (LLMLingua's ratio, as a number)."""
        return self.origin_tokens / max(1, self.kept_tokens)

    def to_json(self) -> dict:
        """The one JSON shape of a result (its keys are listed once, in docs/context.md)."""
        units, req = self.compressed is None and self.cache_fraction is None, self.request
        ranks = {p: r for r, p in enumerate(self.rank)}
        out = {
            "router": self.router,
            "keep": None if req is None else req.keep,
            "target_tokens": None if req is None else req.tokens,
            **({"threshold": req.threshold} if req is not None and req.threshold is not None else {}),
            "units": self.doc.units,
            "unit_sections": [self.doc.title_of(i) for i in range(len(self.doc.units))],
            "kept": self.kept if units else None,
            "scores": self.scores if units else None,
            "unit_tokens": self.lengths,
            "pruned_text": self.text,
            "kept_fraction": self.kept_fraction,
            "origin_tokens": self.origin_tokens,
            "compressed_tokens": self.kept_tokens,
            "ratio": self.ratio,
            "router_seconds": self.seconds if self.cache_fraction is None else None,
            "notes": self.notes,
            "passages": [
                {
                    "index": p,
                    "source": source,
                    "rank": ranks.get(p, p),
                    "units": len(d.units),
                    "kept_units": len(k),
                    "tokens": sum(self.lengths[a:b]),
                    "kept_tokens": sum(self.lengths[a + i] for i in k),
                    "kept": k,
                    "text": t,
                }
                for p, (d, k, t, a, b, source) in enumerate(
                    zip(self.docs, self.passage_kept, self.texts, self.starts, self.starts[1:], self.sources)
                )
            ]
            if units
            else None,
        }
        # the names prune() gave before one result type (kept beside the new ones: docs/context.md)
        out.update(pruned_context=out["pruned_text"], compression_rate=1 - self.kept_fraction, seconds=self.seconds)
        return out


def select_units(
    router, docs: list[Document], scores: Tensor, lengths: list[int], req: Request
) -> tuple[list[int], list[int]]:
    """``(kept, rank)``: the units of ``docs`` (indices over all their units, ascending) that
    ``router`` keeps for ``req`` from ``scores`` (one per unit of every passage), and the
    passages best first. The units of the best passage come first in the order
    :func:`~masklab.text.selection.select` sees, so a tie goes to the better passage and the top
    unit's neighbours are its own passage's. A threshold keeps the units scoring at least it and
    no other (neither the top unit nor its neighbours below it; none where no unit reaches it)."""
    import torch

    starts = [0]
    for d in docs:
        starts.append(starts[-1] + len(d.units))
    rank = sorted(range(len(docs)), key=lambda p: (-float(scores[starts[p] : starts[p + 1]].max()), p))
    order = [i for p in rank for i in range(starts[p], starts[p + 1])]
    ordered, ordered_lengths = scores[order], [lengths[i] for i in order]
    within = len(docs[rank[0]].units)
    keep, cap = (1.0, req.tokens) if req.tokens is not None else (req.fraction, None)
    if req.cap is not None:
        cap = req.cap if cap is None else min(cap, req.cap)
    if req.threshold is not None:  # strict: the units scoring at least it and no other, maybe none
        above = torch.nonzero(ordered >= torch.tensor(req.threshold, dtype=ordered.dtype)).flatten().tolist()
        chosen = select(ordered[above], [ordered_lengths[j] for j in above], 1.0, limit=cap) if above else []
        return sorted(order[above[j]] for j in chosen), rank
    if req.auto:
        if router.keep_auto is None:
            raise MasklabError(
                f"{req.names['auto']} needs a router that decides how much to keep; {router.name} "
                "has no rule of its own: give a fraction"
            )
        keep = auto_fraction(ordered, ordered_lengths, router.keep_auto, router.keep_rule, router.neighbours, within)
    fill = router.fill if req.fill is None else req.fill
    chosen = select(ordered, ordered_lengths, keep, fill=fill, limit=cap, context=router.neighbours, within=within)
    return sorted(order[j] for j in chosen), rank


def notes_of(pruned: Pruned, req: Request, windows: int) -> list[str]:
    """What a user should know about one result: a threshold no unit reaches, a budget capped to
    ``req.cap``, the windows the router read, a top unit alone over the budget."""
    total, what = pruned.origin_tokens, "document is" if len(pruned.docs) == 1 else "passages are"
    budget = req.tokens if req.tokens is not None else total if req.decides else req.fraction * total
    notes = []
    if req.threshold is not None and not pruned.kept:
        notes.append(
            f"no unit scores at least the threshold {req.threshold:g} (the best {max(pruned.scores):.3g}): "
            "nothing was kept"
        )
    if (
        req.cap is not None
        and budget > req.cap
        and (not req.decides or pruned.kept_tokens >= req.cap - max(pruned.lengths))
    ):
        notes.append(
            f"the {what} {total} tokens: the kept units were capped at {req.cap} tokens to fit {req.fits or 'the cap'}"
        )
    if windows > 1:
        notes.append(f"the router read the {what.split()[0]} in {windows} windows")
    if len(pruned.kept) == 1 and pruned.kept_tokens > budget and not req.decides:
        notes.append(
            f"{req.budget_text()} kept {pruned.kept_fraction:.0%} of the tokens: the top unit alone is "
            f"{pruned.kept_tokens} tokens, over the budget of {budget:.0f}, and the top unit is always kept"
        )
    return notes


def stack(docs: list[Document]) -> Document:
    """The passages' units as one document (the document itself for one passage), each unit keeping its
    paragraph, its section and heading path (numbered on, passage after passage) and its passage."""
    if len(docs) == 1:
        return docs[0]
    paragraphs, sections, titles, passage_of, sentences = [], [], [], [], []
    for p, d in enumerate(docs):
        n, base = len(d.units), len(titles)
        for out, ids in ((paragraphs, d.paragraphs), (sentences, d.sentences_of)):
            start, ids = max(out) + 1 if out else 0, ids or list(range(n))
            out += [start + g - min(ids) for g in ids]
        sections += [base + g for g in (d.sections or [0] * n)]
        titles += d.titles or [""]
        passage_of += [p] * n
    return Document(
        units=[u for d in docs for u in d.units],
        paragraphs=paragraphs,
        sections=sections,
        titles=titles,
        passage_of=passage_of,
        sentences_of=sentences,
    )


@dataclass(frozen=True)
class Scores:
    """What one read of a document gives: one ``(N,)`` tensor of scores per question, how many
    ``windows`` the router read (a trained router reads a long document in several) and
    ``notes`` a user should know."""

    values: list[Tensor]
    windows: int = 1
    notes: tuple[str, ...] = ()


class Router:
    """Scores units for a question. ``lm``: the :class:`~masklab.pretrained.models.LoadedModel`
    whose tokenizer counts tokens (and whose layers a router that reads a model reads); None
    counts words.

    What a router supports is declared in its fields, which every front end reads (no list of
    names): ``reads_model`` (it needs ``lm``), ``options`` (the keyword options its constructor
    takes: ``path`` a trained file, ``int8``, ``embedder`` a sentence-transformers folder,
    ``router_model``, ``progress``), ``score_range`` (its scores' bounds: a router with one decides
    how much to keep, so it takes a threshold, and ``keep="auto"`` where it has a ``keep_auto``).
    ``keep_auto``, ``keep_rule``, ``neighbours`` and ``hops`` may come from its weights file's JSON:
    :meth:`capabilities` is the one place they are read."""

    name = ""
    use = ""  # which documents it is for (one line in `masklab compress --list-routers`)
    reads_model = False  # reads the answering model's layers (a model must be given)
    options: tuple[str, ...] = ()  # keyword options its constructor takes (Request.options, the CLI's flags)
    score_range: tuple[float, float] | None = None  # the bounds of the scores (where a threshold may lie), if any
    fill = True  # the default of Request.fill (True: fill the budget)
    keep_auto: float | None = None  # the score from which keep="auto" keeps a unit (routers that decide how much)
    keep_rule = "threshold"  # how keep_auto cuts (selection.KEEP_RULES): a score, or a share of the best unit's score
    neighbours = 0  # units on each side of the best unit kept right after it (selection.select's context)
    hops = 1  # 2: read again with the question and the best unit's text (read_hops)

    @classmethod
    def weights_file(cls, path: str | Path | None = None) -> Path | None:
        """The weights file this router reads when built with ``path``: ``path`` itself, or the one
        it ships (a router with a shipped file overrides this); None: it reads none."""
        return None if path is None else Path(path)

    @classmethod
    def capabilities(cls, path: str | Path | None = None) -> dict[str, Any]:
        """``keep_auto``, ``keep_rule``, ``neighbours`` and ``hops`` of this router built with weights
        file ``path`` (None: the shipped one): the class's fields, with what the file's JSON carries
        (:data:`CAPABILITY_KEYS`). The one place they are read: a router sets its fields from it when
        it is built (:meth:`take_capabilities`), and :class:`Request` checks a budget against it."""
        out = {f: getattr(cls, f) for f in CAPABILITY_KEYS.values()}
        file = cls.weights_file(path)
        if file is not None:
            meta = weights_meta(str(file))
            out.update({f: meta[key] for key, f in CAPABILITY_KEYS.items() if meta.get(key) is not None})
        return out

    def take_capabilities(self, path: str | Path | None = None) -> None:
        """Set this router's capability fields from :meth:`capabilities` of its weights file ``path``."""
        for key, value in self.capabilities(path).items():
            setattr(self, key, value)

    def __init__(self, lm=None) -> None:
        if self.reads_model and lm is None:
            raise MasklabError(f"the {self.name} router reads a language model: give one (--model / model=...)")
        self.lm = lm
        self.notes: list[str] = []  # set once when it is built: what a user should know (which model ranked, ...)

    @property
    def tokenizer(self):
        return None if self.lm is None else self.lm.tokenizer

    def score(self, doc: Document, question: str) -> Tensor:
        """``(N,)``: one score per unit of ``doc``, higher = keep first (the one method to override)."""
        raise NotImplementedError

    def read(self, doc: Document, questions: list[str]) -> Scores:
        """The scores of ``doc`` for each of ``questions`` and what the caller should know: :meth:`score`
        for each (a router that reads several questions in one batch, or in windows, overrides this)."""
        return Scores([self.score(doc, q) for q in questions])

    def read_hops(self, doc: Document, questions: list[str]) -> Scores:
        """:meth:`read`, then where :attr:`hops` is 2 a second hop: each question again, followed by the
        text of its best unit, and each unit's higher score of the two (a unit that explains what the
        best unit names can rise though it shares no word with the question)."""
        import torch

        first = self.read(doc, questions)
        if self.hops < 2 or len(doc.units) < 2:
            return first
        again = self.read(doc, [f"{q} {doc.units[int(s.argmax())]}" for q, s in zip(questions, first.values)])
        return Scores(
            [torch.maximum(a, b) for a, b in zip(first.values, again.values)],
            first.windows + again.windows,
            tuple(dict.fromkeys(first.notes + again.notes)),
        )

    def checked(self, doc: Document, scores: Tensor) -> Tensor:
        """``scores``, refused unless there is one per unit of ``doc``."""
        if scores.shape != (len(doc.units),):
            raise MasklabError(
                f"router {self.name!r} returned scores of shape {tuple(scores.shape)} "
                f"for {len(doc.units)} units; expected ({len(doc.units)},)"
            )
        return scores

    def prune(self, request: Request) -> Pruned:
        """What this router keeps for ``request`` (:mod:`masklab.context.router`)."""
        return self.prune_all([request])[0]

    def prune_all(self, requests: list[Request]) -> list[Pruned]:
        """:meth:`prune` for each of ``requests``, in order (each checked against this router); the
        questions on the same passages are read together (:meth:`read`: one batch for a
        cross-encoder), their units cut once."""
        requests = [r if router_class(r.router) is type(self) else replace(r, router=type(self)) for r in requests]
        groups: dict[tuple, list[int]] = {}
        for k, r in enumerate(requests):
            key = (r.unit_tokens, *(p if isinstance(p, str) else id(p) for p in r.passages))
            groups.setdefault(key, []).append(k)
        out: list[Pruned | None] = [None] * len(requests)
        for ks in groups.values():
            first = requests[ks[0]]
            docs = [
                p if isinstance(p, Document) else segment(p, self.tokenizer, first.unit_tokens) for p in first.passages
            ]
            doc = stack(docs)
            lengths = doc.lengths(self.tokenizer)
            t0 = time.perf_counter()
            read = self.read_hops(doc, [requests[k].question for k in ks])
            seconds = (time.perf_counter() - t0) / len(ks)
            for k, scores in zip(ks, read.values):
                req, scores = requests[k], self.checked(doc, scores)
                kept, rank = select_units(self, docs, scores, lengths, req)
                out[k] = Pruned(
                    doc,
                    kept,
                    [float(s) for s in scores],
                    lengths,
                    seconds,
                    self.name,
                    passages=docs if len(docs) > 1 else None,
                    rank=rank,
                    request=req,
                    neighbours=self.neighbours,
                    keep_auto=self.keep_auto,
                    keep_rule=self.keep_rule,
                )
                out[k].notes = [*self.notes, *read.notes, *notes_of(out[k], req, read.windows)]
        return out

    def press(self, question: str, keep: float = 0.25, fill: bool | None = None):
        """A kvpress press that prefills only the units this router keeps of the context the
        pipeline is given (:class:`masklab.context.press.ContextPress`)."""
        from masklab.context.press import ContextPress

        check_keep(keep)
        if self.lm is None:
            raise MasklabError("a press needs the model's tokenizer: load the router with model=...")

        def prune_doc(doc: Document) -> Pruned:  # the units kept of the context the pipeline prefills
            return self.prune(Request.of(question, [doc], keep=keep, fill=fill, router=type(self)))

        return ContextPress(router=self, question=question, keep=keep, fill=fill, prune_doc=prune_doc)
