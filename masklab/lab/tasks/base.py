"""What the lab's tasks build on beside the product's :class:`~masklab.text.document.Document`:
:class:`Example` (a document with the query a model completes after it) and the plain sentence
cuts that some tasks keep because their results were made with them, where
:func:`~masklab.text.document.segment` (the product's one cut) would cut their texts otherwise:
:func:`regex_sentences` (SQuAD, ``cite``), :func:`chunked_sentences` (``masklab cite``),
:func:`pieces_at_stops` (the stale prompts' filler) and :func:`bling_fire_sentences` (Bling Fire
alone: the haystack families' filler).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from masklab.text.document import Document
from masklab.text.query import Query


@dataclass(kw_only=True)
class Example(Document):
    """A task's ``Document`` with the ``query`` a model completes after it (a
    :attr:`Query.text <masklab.text.query.Query.text>`); a task says how an answer is checked
    (``is_correct(answer) -> bool``)."""

    query: str

    @property
    def question(self) -> str:
        """What a router reads: ``"Question: ..."`` (the query without its answer line)."""
        return Query.parse(self.query).question_line.strip()


# Cuts that some callers keep because their results were made with them: segment would cut
# their texts differently (Bling Fire instead of a regex gives other sentences for 97 of
# pydoc's 2,608 topic paragraphs; segment also joins headings and markers), changing numbers.

_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
CHUNK_WORDS = 40  # chunked_sentences: a sentence of over twice this many words is cut into chunks of this many


def regex_sentences(text: str) -> list[str]:
    """``text`` cut into sentences by a regex: at ``.``/``!``/``?`` followed by whitespace and
    a capital, digit, quote or ``(``, and at blank lines; whitespace inside a sentence is
    collapsed to one space, and no sentence is empty (no downloads, no models).

    Callers: SQuAD contexts (:func:`masklab.lab.tasks.squad.to_item`), a text context of
    :func:`masklab.lab.lm_evidence.cite` and ``masklab cite`` (:func:`chunked_sentences`).
    Unlike :func:`~masklab.text.document.segment` it keeps no character spans, joins no headings or list markers,
    and splits wherever the regex matches ("Mr. Smith", "e.g. The"), where Bling Fire would
    not."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        block = " ".join(block.split())
        out += [s for s in _SENTENCE_BREAK.split(block) if s]
    return out


def chunked_sentences(text: str, chunk_words: int = CHUNK_WORDS) -> tuple[list[str], int]:
    """``masklab cite``'s evidence items: :func:`regex_sentences`, except that a sentence of
    more than ``2 * chunk_words`` words (a stretch without sentence punctuation) is cut into
    chunks of ``chunk_words`` words. Returns the items and how many sentences were cut."""
    out, cut = [], 0
    for s in regex_sentences(text):
        words = s.split()
        if len(words) > 2 * chunk_words:
            out += [" ".join(words[i : i + chunk_words]) for i in range(0, len(words), chunk_words)]
            cut += 1
        else:
            out.append(s)
    return out, cut


def bling_fire_sentences(text: str) -> list[str]:
    """Bling Fire's sentences of the whole ``text``, whitespace inside each collapsed to one
    space: no paragraphs, headings, markers or spans as in :func:`~masklab.text.document.segment` (a sentence may be
    empty). Caller: :func:`masklab.lab.tasks.families.filler_pool`, which keeps the plain prose
    sentences of a corpus as filler."""
    import blingfire

    return [" ".join(s.split()) for s in blingfire.text_to_sentences(text).split("\n")]


def pieces_at_stops(text: str) -> list[str]:
    """``text`` cut after every ``.``/``!``/``?`` that whitespace follows, whitespace inside a
    piece collapsed to one space (a piece may be empty; blank lines do not cut).

    Caller: :func:`masklab.lab.tasks.stale_prompts.distractor_pool`, which keeps the pieces of
    pydoc's topics that are plain prose sentences. Unlike :func:`regex_sentences` it also cuts
    before a lower-case word, so its pool differs (414 sentences against 545)."""
    return [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+", text)]
