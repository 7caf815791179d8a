"""A context cut into units (sentences, list items or chunks): the one document type of masklab.

``Document(units, gold=[], spans=None, source=None)``: the routers score ``units``; a model
reads ``" ".join(units)`` (:attr:`Document.context`). A document cut from a user's text by
:func:`segment` also keeps that text (``source``) and each unit's character span in it, so
the pruned text keeps the original line and paragraph breaks (:meth:`Document.text_of`) and
a page can highlight the kept units. Generated tasks set ``gold`` (the indices of the units
that answer); their examples are documents, most of them the lab's
:class:`~masklab.lab.tasks.base.Example` (a ``Document`` with the query a model completes after it).

Segmentation (:func:`segment`), with regexes over lines and Bling Fire's sentence breaker
(a maintained finite-state model) on prose only. Paragraphs end at blank lines (a fenced
code block is one paragraph). A unit is then:

* a sentence of prose, as Bling Fire cuts it inside its paragraph; a piece that is only a
  number or marker ("2.", "1.1.", "Q.", "(a)", "-") joins the sentence after it (a short
  title after a number, "2. Grant of Copyright License.", joins it too), punctuation alone
  joins the sentence before;
* list items (lines that start with "-", "*", "1.", "1)", "(a)", "a)", "Q." or "A:"), as
  many whole items as fit in ``unit_tokens`` tokens; an item longer than that is cut into
  its sentences;
* a table (lines with "|" and a rule line), a fenced code block or a paragraph indented
  further than the one before it and not ending like a sentence (code): whole up to
  ``unit_tokens``, else cut at line breaks.

A heading does not stand alone: a paragraph that is a Markdown ``#`` line, a reST
underlined title, an all-caps line (a man-page section name), a numbered title or only
markers, or any other short line without sentence-final punctuation ("Preamble", "For
example:", "* Internationalisation"), is the leading text of the first unit of the text
after it (headings in a row all lead it; two plain short lines in a row, "Then" and
"gunzip -c foo", make one unit; a plain short line before a heading, or headings at the end
of the text, end the unit before them). A paragraph's last sentence that is such a short
line and ends in ":" or has at most 4 words ("For example:", "This is as if") leads the
next paragraph the same way. A sentence longer than ``unit_tokens`` tokens is cut into
chunks of at most that many, at line breaks where it has them (a unit led by headings is
longer by their tokens). Units are whitespace-trimmed, never empty, and every non-space
character of the text is in exactly one unit.

This module is the product's one cut of text. The lab's callers whose results were made with
a plain regex cut keep it in :mod:`masklab.lab.tasks.base`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from masklab.util.errors import MasklabError

UNIT_TOKENS = 64  # the default longest unit, in model tokens (about three sentences of prose)
SENTENCE_PIECES = 3  # a text cut into more pieces than this by the unit-length cut is no sentence kept together


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
    # where each unit stands (None where unknown): its blank-line paragraph, its section (the text under one
    # heading: ``titles[section]`` is the heading path above it, "" before the first heading) and, in several
    # passages read as one, its passage
    paragraphs: list[int] | None = None
    sections: list[int] | None = None
    titles: list[str] | None = None
    passage_of: list[int] | None = None
    sentences_of: list[int] | None = None  # each unit's sentence: the pieces of one the unit-length cut split share it

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

    def groups(self, level: str) -> list[int]:
        """``(N,)`` each unit's group at ``level``: ``"sentence"`` (the pieces of one long sentence) or
        ``"paragraph"`` (a unit alone where either is unknown), or ``"section"`` (a section never spans two
        passages; one section where unknown)."""
        n = len(self.units)
        if level in ("sentence", "paragraph"):
            ids = (self.sentences_of if level == "sentence" else self.paragraphs) or list(range(n))
        elif level == "section":
            ids = self.sections or [0] * n
        else:
            raise ValueError(f"unknown level {level!r}")
        passage = self.passage_of or [0] * n
        keys: dict[tuple[int, int], int] = {}
        return [keys.setdefault((p, g), len(keys)) for p, g in zip(passage, ids)]

    def title_of(self, i: int) -> str:
        """The heading path above unit ``i`` ("" where it has none)."""
        if not self.sections or not self.titles:
            return ""
        return self.titles[self.sections[i]]

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
            gap = self.source[self.spans[a][1] : self.spans[b][0]]
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
        if cur is not None and count_tokens(tokenizer, text[cur[0] : b]) <= unit_tokens:
            cur = (cur[0], b)
            continue
        if cur is not None:
            spans.append(cur)
        cur = (a, b)
        if count_tokens(tokenizer, text[a:b]) > unit_tokens:  # one long line: cut by tokens
            offs = [(x + a, y + a) for x, y in token_offsets(tokenizer, text[a:b]) if y > x]
            for i in range(0, len(offs), unit_tokens):
                piece = offs[i : i + unit_tokens]
                spans.append((piece[0][0] if i else a, piece[-1][1] if i + unit_tokens < len(offs) else b))
            cur = None
    if cur is not None:
        spans.append(cur)
    return [(a + start, b + start) for a, b in spans]


# Line-level patterns (regexes over lines; Bling Fire runs only on prose).
_MARK = r"(?:[-*+•·#=~_|>]+|\(?\d{1,3}(?:\.\d{1,3})*[.):]?|\(\w{1,4}\)|[A-Za-z][.):])"
_MARKER_ONLY = re.compile(rf"\s*{_MARK}(?:\s+{_MARK})*\s*")  # "2.", "1.1.", "Q.", "(a)", "-", "* *"
_ITEM = re.compile(r"[ \t]*(?:[-*+•]|\d{1,3}(?:\.\d{1,3})*[.)]|\(\w{1,4}\)|[a-z][.)]|[QA][.:])[ \t]+\S")
_NUMBERED = re.compile(r"\s*(?:\d{1,3}(?:\.\d{1,3})*\.?|[A-Z]\.|\(\w{1,4}\))\s+(\S.*)", re.S)
_ATX = re.compile(r"[ \t]{0,3}#{1,6}(?:[ \t].*)?")  # Markdown "## Install"
_UNDERLINE = re.compile(r"[ \t]*([=\-~^*#+`'\"_.:])\1{2,}[ \t]*")  # reST "=======" (also an overline)
_FENCE = re.compile(r"^[ \t]*(?:```|~~~)", re.M)
_TABLE_RULE = re.compile(r"[ \t]*[|+]?[ \t]*:?-{3,}:?[ \t]*(?:[|+][ \t]*:?-*:?[ \t]*)*")


def _words(s: str) -> list[str]:
    return re.findall(r"\w+", s)


def _title(s: str) -> bool:
    """A short title: at most 8 words, the first capitalised and most of them too ("Grant of
    Copyright License.", "Definitions", "TERMS AND CONDITIONS"), no sentence mark but a final
    full stop."""
    w = _words(s)
    if not w or len(w) > 8 or not w[0][0].isupper() or re.search(r"[.!?]\S*\s", s) or s.rstrip()[-1] in "!?,;":
        return False
    return sum(x[0].isupper() or x[0].isdigit() for x in w) * 2 > len(w)


def _heading(block: str) -> str | None:
    """'explicit' for a paragraph that is a heading by its form (a Markdown ``#`` line, a reST
    underlined title, an all-caps line, a numbered title like "2. Grant of Copyright License.",
    only markers like "Q." or "---"), 'generic' for any other short line without sentence-final
    punctuation ("Preamble", "For example:", "* Internationalisation"), else None."""
    lines = block.strip().splitlines()
    if len(lines) in (2, 3) and _UNDERLINE.fullmatch(lines[-1]) and (len(lines) == 2 or _UNDERLINE.fullmatch(lines[0])):
        title = lines[-2].strip()
        return "explicit" if 0 < len(_words(title)) <= 12 else None
    if len(lines) != 1:
        return None
    s = lines[0].strip()
    if _MARKER_ONLY.fullmatch(s) or _ATX.fullmatch(lines[0]):
        return "explicit"
    w = _words(s)
    if len(w) <= 8 and any(c.isalpha() for c in s) and s == s.upper() and s[-1] not in ".!?,;":
        return "explicit"  # a man-page section name
    m = _NUMBERED.fullmatch(s)
    if m and _title(m.group(1)):
        return "explicit"
    if len(w) <= 10 and len(s) <= 80 and s[-1] not in ".!?":
        return "generic"
    return None


def _heading_title(block: str, underlines: dict[str, int]) -> tuple[int, str] | None:
    """``(level, title)`` of a paragraph :func:`_heading` calls explicit, None for markers alone
    ("Q.", "---"), which head no section. Levels: a Markdown heading's ``#`` count, a reST title's
    underline character in the order first seen (``underlines`` records it), a numbered title's depth
    ("2.1 Scope": 2), 1 for an all-caps line."""
    lines = block.strip().splitlines()
    if len(lines) in (2, 3) and _UNDERLINE.fullmatch(lines[-1]):
        char = lines[-1].strip()[0] + ("o" if len(lines) == 3 else "")
        return underlines.setdefault(char, len(underlines) + 1), lines[-2].strip()
    s = lines[0].strip()
    if _MARKER_ONLY.fullmatch(s):
        return None
    if _ATX.fullmatch(lines[0]):
        title = s.lstrip("#").strip().rstrip("#").strip()
        return (len(s) - len(s.lstrip("#")), title) if title else None
    m = _NUMBERED.fullmatch(s)
    if m and _title(m.group(1)):
        return s[: m.start(1)].strip().rstrip(".").count(".") + 1, s
    return 1, s


def _structure(text: str, units: list[tuple[int, int]], headings: list[tuple[int, int]]):
    """``(paragraphs, sections, titles)`` of units at character spans ``units``: each unit's blank-line
    paragraph (the one its last character is in), its section (the last explicit heading that starts
    before its last character; 0 before any) and each section's heading path (``" > "``-joined titles of
    the headings above it by level)."""
    from bisect import bisect_right

    paras = _paragraphs(text)
    starts = [a for a, _ in paras]
    paragraphs = [max(0, bisect_right(starts, b - 1) - 1) for _, b in units]
    for a, b in paras:  # a man page's "OPTIONS" line over its indented text, in one paragraph
        first = text[a:b].split("\n", 1)
        if len(first) == 2 and _heading(first[0]) == "explicit" and _indent(first[1]) > _indent(first[0]):
            headings.append((a, a + len(first[0])))
    titles, where, path, underlines = [""], [], [], {}
    for a, b in sorted(set(headings)):
        head = _heading_title(text[a:b], underlines)
        if head is None:
            continue
        level, title = head
        while path and path[-1][0] >= level:
            path.pop()
        path.append((level, " ".join(title.split())))
        titles.append(" > ".join(t for _, t in path))
        where.append(a)
    sections = [bisect_right(where, b - 1) for _, b in units]
    return paragraphs, sections, titles


def _lines(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each line of ``text[a:b]`` (without its line break)."""
    out, pos = [], a
    for line in text[a:b].split("\n"):
        out.append((pos, pos + len(line)))
        pos += len(line) + 1
    return out


def _paragraphs(text: str) -> list[tuple[int, int]]:
    """Blank-line paragraphs, a fenced code block (```) with its blank lines as one."""
    paras: list[tuple[int, int]] = []
    open_fence = False
    for m in re.finditer(r"\S(?:.*?\S)?(?=\s*\n\s*\n|\s*$)", text, flags=re.S):
        if open_fence:
            paras[-1] = (paras[-1][0], m.end())
        else:
            paras.append(m.span())
        if len(_FENCE.findall(m.group())) % 2:
            open_fence = not open_fence
    return paras


def _sentences(text: str, a: int, b: int, tokenizer, unit_tokens: int) -> list[tuple[int, int]]:
    """Prose ``text[a:b]`` as Bling Fire sentences that cover it, a sentence that is only
    markers ("2.", "Q.") joined to the next one (with a short title after a number, "2. Grant
    of Copyright License.", to the one after it), punctuation alone or a lower-case tail of
    at most 3 tokens (cut off after a quotation) to the previous one, and
    any piece longer than ``unit_tokens`` cut by :func:`_split_long`."""
    import blingfire

    cuts = [a + s for s, _ in blingfire.text_to_sentences_and_offsets(text[a:b])[1]][1:]
    pieces = [[x, y] for x, y in zip([a] + cuts, cuts + [b]) if text[x:y].strip()]
    if pieces:
        pieces[0][0] = a
    out: list[list[int]] = []
    carry = None  # start of markers waiting for their sentence
    for i, (x, y) in enumerate(pieces):
        if carry is not None:
            x, carry = carry, None
        s = text[x:y]
        if out and (not re.search(r"\w", s) or (re.match(r"\s*[a-z]", s) and len(word_offsets(s)) <= 3)):
            out[-1][1] = y  # "]", "..." or a short lower-case tail ("sections).") ends the sentence before
            continue
        last = i == len(pieces) - 1
        m = _NUMBERED.fullmatch(s.strip())
        if not last and (
            _MARKER_ONLY.fullmatch(s) or (m and _MARKER_ONLY.fullmatch(s.strip()[: m.start(1)]) and _title(m.group(1)))
        ):
            carry = x
            continue
        out.append([x, y])
    spans: list[tuple[int, int]] = []
    for x, y in out:
        if count_tokens(tokenizer, text[x:y]) > unit_tokens:
            pieces = _split_long(text[x:y], x, tokenizer, unit_tokens)
            if len(pieces) <= SENTENCE_PIECES:  # longer: no sentence (a table or log without full stops)
                pieces = pieces[:1] + [_Piece(p) for p in pieces[1:]]
            spans += pieces
        else:
            spans.append((x, y))
    return spans


class _Piece(tuple):
    """The span of a piece of a sentence after its first, where the unit-length cut split it (into at most
    :data:`SENTENCE_PIECES` pieces)."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _blocks(text: str, p0: int, p1: int, prev_indent: int | None, tokenizer, unit_tokens: int):
    """One paragraph as ``(kind, spans)`` blocks: ``("explicit"|"generic", [span])`` for a
    heading, ``("units", spans)`` for text; and the paragraph's indentation."""
    l0 = text.rfind("\n", 0, p0) + 1
    lines = [(a, b) for a, b in _lines(text, l0, p1)]
    raw = [text[a:b] for a, b in lines]
    indent = _indent(raw[0])
    body = text[p0:p1]
    kind = _heading(body)
    if kind:
        return [(kind, [(p0, p1)])], indent
    nonblank = [r for r in raw if r.strip()]
    lowest = min(_indent(r) for r in nonblank)
    fenced = bool(_FENCE.match(raw[0]))
    table = all("|" in r for r in nonblank) and (
        any(_TABLE_RULE.fullmatch(r) for r in nonblank) or all(r.lstrip().startswith("|") for r in nonblank)
    )
    grid = raw[0].lstrip().startswith("+-")
    code = prev_indent is not None and lowest >= prev_indent + 3 and body.rstrip()[-1] not in ".!?"
    if fenced or table or grid or code:  # whole up to unit_tokens, then at line breaks
        spans = (
            [(p0, p1)]
            if count_tokens(tokenizer, body) <= unit_tokens
            else _split_long(body, p0, tokenizer, unit_tokens)
        )
        return [("units", spans)], (indent if not code else prev_indent)
    framed = all(r.lstrip()[:1] == "*" and r.rstrip()[-1:] == "*" for r in nonblank)
    starts = [] if framed else [i for i, r in enumerate(raw) if _ITEM.match(r)]
    if not starts:
        spans = _sentences(text, p0, p1, tokenizer, unit_tokens)
        a, b = spans[-1]
        tail = text[a:b].strip()
        if len(spans) > 1 and _heading(tail) == "generic" and (tail[-1] == ":" or len(_words(tail)) <= 4):
            return [("units", spans[:-1]), ("generic", [(a, b)])], indent  # "For example:" leads on
        return [("units", spans)], indent
    blocks = []
    if starts[0] > 0:  # the text before the first item: a heading or sentences
        lead_end = lines[starts[0] - 1][1]
        kind = _heading(text[p0:lead_end])
        blocks.append(
            (kind, [(p0, lead_end)]) if kind else ("units", _sentences(text, p0, lead_end, tokenizer, unit_tokens))
        )
    items = [
        (max(lines[i][0] + _indent(raw[i]), p0), lines[j - 1][1]) for i, j in zip(starts, starts[1:] + [len(lines)])
    ]
    spans: list[tuple[int, int]] = []
    cur = None
    for a, b in items:  # whole items, as many as fit in unit_tokens
        if cur is not None and count_tokens(tokenizer, text[cur[0] : b]) <= unit_tokens:
            cur = (cur[0], b)
            continue
        if cur is not None:
            spans.append(cur)
            cur = None
        if count_tokens(tokenizer, text[a:b]) <= unit_tokens:
            cur = (a, b)
        else:
            spans += _sentences(text, a, b, tokenizer, unit_tokens)
    if cur is not None:
        spans.append(cur)
    blocks.append(("units", spans))
    return blocks, indent


def segment(text: str, tokenizer=None, unit_tokens: int = UNIT_TOKENS) -> Document:
    """``text`` cut into units: sentences, whole list items, table rows and code lines up to
    ``unit_tokens`` tokens, headings and markers joined to the text they label (module
    docstring). ``tokenizer``: a Hugging Face tokenizer (None counts words and punctuation
    marks). Units are whitespace-trimmed and never empty, and every non-space character of
    ``text`` is in exactly one unit."""
    if unit_tokens < 1:
        raise MasklabError(f"--unit-tokens must be at least 1, got {unit_tokens}")
    if not text.strip():
        raise MasklabError("the context is empty")
    spans: list[tuple[int, int]] = []
    headings: list[tuple[int, int]] = []  # the explicit headings (they start sections)
    pending = None  # [start, end, explicit, last_generic]: headings waiting for their text
    prev_indent = None
    for p0, p1 in _paragraphs(text):
        blocks, prev_indent = _blocks(text, p0, p1, prev_indent, tokenizer, unit_tokens)
        headings += [bspans[0] for kind, bspans in blocks if kind == "explicit"]
        for kind, bspans in blocks:
            if kind == "units":
                if pending is not None:
                    bspans = [(pending[0], bspans[0][1])] + bspans[1:]
                    pending = None
                spans += bspans
                continue
            a, b = bspans[0]
            if pending is None:
                pending = [a, b, kind == "explicit", kind == "generic"]
            elif kind == "generic" and pending[3]:  # "Then" + "gunzip -c foo": a unit
                spans.append((pending[0], b))
                pending = None
            elif kind == "explicit" and not pending[2]:  # a short line ends its section
                if spans:
                    spans[-1] = (spans[-1][0], pending[1])
                else:
                    spans.append((pending[0], pending[1]))
                pending = [a, b, True, False]
            else:
                pending = [pending[0], b, True, kind == "generic"]
            if pending is not None and count_tokens(tokenizer, text[pending[0] : pending[1]]) > unit_tokens:
                spans.append((pending[0], pending[1]))  # a run of short lines long enough to stand
                pending = None
    if pending is not None:  # headings at the end: the last unit's trailing text
        if spans:
            spans[-1] = (spans[-1][0], pending[1])
        else:
            spans.append((pending[0], pending[1]))
    units, trimmed, sentences = [], [], []
    for span in spans:
        a, b = span
        piece = text[a:b]
        lead = len(piece) - len(piece.lstrip())
        unit = piece.strip()
        if unit:
            units.append(unit)
            trimmed.append((a + lead, a + lead + len(unit)))
            sentences.append(sentences[-1] if sentences and isinstance(span, _Piece) else len(sentences))
    paragraphs, sections, titles = _structure(text, trimmed, headings)
    return Document(
        units=units,
        spans=trimmed,
        source=text,
        paragraphs=paragraphs,
        sections=sections,
        titles=titles,
        sentences_of=sentences,
    )
