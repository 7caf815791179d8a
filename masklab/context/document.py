"""A context cut into units (sentences or chunks): the one document type of masklab.context.

``Document(units, gold=[], spans=None, source=None)``: the routers score ``units``; a model
reads ``" ".join(units)`` (:attr:`Document.context`). A document cut from a user's text by
:func:`segment` also keeps that text (``source``) and each unit's character span in it, so
the pruned text keeps the original line and paragraph breaks (:meth:`Document.text_of`) and
a page can highlight the kept units. Generated tasks set ``gold`` (the indices of the units
that answer); :class:`masklab.tasks.longctx.LongExample` is a ``Document``.

Segmentation (:func:`segment`): sentences from Bling Fire's sentence breaker (a maintained
finite-state model, about 1 MB of text in half a second) inside each paragraph (blank
lines end paragraphs), then any unit longer than
``unit_tokens`` tokens, as text without sentence punctuation (code, lists, tables) is, is
cut into chunks of at most ``unit_tokens`` tokens, at line breaks where it has them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from masklab.errors import MasklabError

UNIT_TOKENS = 64  # the default longest unit, in model tokens (about three sentences of prose)


_WORDS = re.compile(r"\w+|[^\w\s]")




def word_offsets(text: str) -> list[tuple[int, int]]:
    """A tokenizer-free stand-in: words and punctuation marks as tokens (character offsets)."""
    return [m.span() for m in _WORDS.finditer(text)]


def token_offsets(tokenizer, text: str) -> list[tuple[int, int]]:
    """Character offsets of ``text``'s tokens (no special tokens); ``tokenizer`` None uses
    :func:`word_offsets`."""
    if tokenizer is None:
        return word_offsets(text)
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    return [tuple(o) for o in enc["offset_mapping"]]


def count_tokens(tokenizer, text: str) -> int:
    if tokenizer is None:
        return len(word_offsets(text))
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(kw_only=True)
class Document:
    """``units`` in reading order; ``gold``: indices of the answering units (generated tasks);
    ``spans``: each unit's ``[start, end)`` in ``source`` (documents cut from a user's text)."""

    units: list[str]
    gold: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] | None = None
    source: str | None = None

    @property
    def sentences(self) -> list[str]:
        """The units (the name the evidence and long-context code has always used)."""
        return self.units

    @property
    def context(self) -> str:
        return " ".join(self.units)

    def __len__(self) -> int:
        return len(self.units)

    def lengths(self, tokenizer) -> list[int]:
        """Tokens of each unit as it sits in :attr:`context` (with its leading space);
        ``tokenizer`` None counts words and punctuation marks."""
        return [count_tokens(tokenizer, (" " if i else "") + u) for i, u in enumerate(self.units)]

    def text_of(self, kept: list[int]) -> str:
        """The kept units in reading order. With a ``source``, two units that were neighbours
        keep the whitespace between them; a gap over removed units becomes a paragraph break,
        a line break or a space, the strongest break it spanned."""
        kept = sorted(kept)
        if self.spans is None or self.source is None:
            return " ".join(self.units[i] for i in kept)
        out = []
        for a, b in zip(kept, kept[1:] + [None]):
            out.append(self.units[a])
            if b is None:
                break
            gap = self.source[self.spans[a][1]:self.spans[b][0]]
            if b == a + 1:
                out.append(gap if gap else " ")
            else:
                out.append("\n\n" if "\n\n" in gap else "\n" if "\n" in gap else " ")
        return "".join(out)


def _split_long(text: str, start: int, tokenizer, unit_tokens: int) -> list[tuple[int, int]]:
    """Spans (into the caller's text, offset ``start``) of ``text`` cut into pieces of at most
    ``unit_tokens`` tokens: whole lines while they fit, a longer line by its tokens."""
    spans: list[tuple[int, int]] = []
    lines, pos = [], 0
    for line in text.splitlines(keepends=True):
        lines.append((pos, pos + len(line)))
        pos += len(line)
    cur: tuple[int, int] | None = None
    for a, b in lines:
        if cur is not None and count_tokens(tokenizer, text[cur[0]:b]) <= unit_tokens:
            cur = (cur[0], b)
            continue
        if cur is not None:
            spans.append(cur)
        cur = (a, b)
        if count_tokens(tokenizer, text[a:b]) > unit_tokens:  # one long line: cut by tokens
            offs = [(x + a, y + a) for x, y in token_offsets(tokenizer, text[a:b]) if y > x]
            for i in range(0, len(offs), unit_tokens):
                piece = offs[i:i + unit_tokens]
                spans.append((piece[0][0] if i else a, piece[-1][1] if i + unit_tokens < len(offs) else b))
            cur = None
    if cur is not None:
        spans.append(cur)
    return [(a + start, b + start) for a, b in spans]


def segment(text: str, tokenizer=None, unit_tokens: int = UNIT_TOKENS) -> Document:
    """``text`` cut into sentences, and any sentence longer than ``unit_tokens`` tokens into
    chunks (module docstring). ``tokenizer``: a Hugging Face tokenizer (None counts words
    and punctuation marks). Units are whitespace-trimmed and never empty."""
    import blingfire

    if unit_tokens < 1:
        raise MasklabError(f"--unit-tokens must be at least 1, got {unit_tokens}")
    if not text.strip():
        raise MasklabError("the context is empty")
    spans: list[tuple[int, int]] = []
    for para in re.finditer(r"\S(?:.*?\S)?(?=\s*\n\s*\n|\s*$)", text, flags=re.S):  # paragraphs: blank lines
        p0 = para.start()
        for a, b in blingfire.text_to_sentences_and_offsets(para.group())[1]:  # character offsets
            piece = para.group()[a:b]
            if not piece.strip():
                continue
            if count_tokens(tokenizer, piece) > unit_tokens:
                spans += _split_long(piece, p0 + a, tokenizer, unit_tokens)
            else:
                spans.append((p0 + a, p0 + b))
    units, trimmed = [], []
    for a, b in spans:
        piece = text[a:b]
        lead = len(piece) - len(piece.lstrip())
        unit = piece.strip()
        if unit:
            units.append(unit)
            trimmed.append((a + lead, a + lead + len(unit)))
    return Document(units=units, spans=trimmed, source=text)

