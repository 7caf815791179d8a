"""The one prompt tail every masklab task and command asks with: a question and the answer's prefix.

``Query("What is X?", "X is").text == "\\nQuestion: What is X?\\nAnswer: X is"``; without a
prefix the text ends at ``"Answer:"``. A model reads ``context + query.text`` (raw prompts);
chat prompts put :attr:`Query.question_line` in the user turn and :attr:`Query.answer_line`
after the assistant's opening (:func:`masklab.pretrained.lm.prompt_parts`). :meth:`Query.parse`
reads such a text back (``Query.parse(q.text) == q``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

QUESTION = "\nQuestion: "
ANSWER = "\nAnswer:"


@dataclass(frozen=True)
class Query:
    question: str  # the question, without "Question: "
    prefix: str = ""  # the start of the answer the model completes ("" for none)

    @property
    def question_line(self) -> str:
        """``"\\nQuestion: <question>"``."""
        return QUESTION + self.question

    @property
    def answer_line(self) -> str:
        """``"Answer:"`` or ``"Answer: <prefix>"``."""
        return ANSWER.lstrip("\n") + (f" {self.prefix}" if self.prefix else "")

    @property
    def text(self) -> str:
        return self.question_line + "\n" + self.answer_line

    @classmethod
    def parse(cls, text: str) -> Query:
        """The query a :attr:`text` was made from; a text without ``"\\nAnswer:"`` is all
        question, a text without ``"\\nQuestion: "`` is a bare question."""
        head, sep, tail = text.rpartition(ANSWER)
        if not sep:
            head, tail = text, ""
        question = head[len(QUESTION) :] if head.startswith(QUESTION) else head.strip()
        return cls(question, tail[1:] if tail.startswith(" ") else tail)


def answer_head(generated: str) -> str:
    """The scored part of a continuation: up to the first punctuation mark or line break,
    without a leading "now" (``... locker is now 2506``)."""
    head = re.split(r"[.,;:!?\n]", generated.strip(), maxsplit=1)[0].strip()
    return re.sub(r"^now\s+", "", head, flags=re.I)
