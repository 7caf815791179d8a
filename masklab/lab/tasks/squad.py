"""SQuAD v1.1 from a local copy of the official JSON (``train-v1.1.json``/``dev-v1.1.json``).

Format: ``{"version": "1.1", "data": [{"title", "paragraphs": [{"context", "qas": [{"id",
"question", "answers": [{"text", "answer_start"}]}]}]}]}``. Nothing is downloaded: the user
passes the file (``--squad PATH``). Each question becomes a context of sentences (split
without downloads) whose ``gold`` sentence holds the first answer's ``answer_start``;
scoring is SQuAD's normalised exact match of the first line generated.
"""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

from masklab.lab.tasks.base import Example, regex_sentences
from masklab.text.query import Query
from masklab.util.errors import MasklabError


@dataclass
class SquadExample:
    id: str
    title: str
    context: str
    question: str
    answers: list[str]
    answer_start: int


def load_squad(path: str | Path, limit: int | None = None) -> list[SquadExample]:
    """Read SQuAD v1.1 JSON; malformed files raise a :class:`MasklabError` naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise MasklabError(f"SQuAD file {path} not found: pass the official train-v1.1.json or dev-v1.1.json")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MasklabError(f"{path} is not valid JSON ({e}); expected the official SQuAD v1.1 file") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise MasklabError(f"{path} has no 'data' list; expected the official SQuAD v1.1 format")
    out: list[SquadExample] = []
    try:
        for art in doc["data"]:
            for para in art["paragraphs"]:
                for qa in para["qas"]:
                    if not qa["answers"]:
                        continue  # SQuAD 2.0 unanswerable questions
                    out.append(
                        SquadExample(
                            str(qa["id"]),
                            str(art.get("title", "")),
                            para["context"],
                            qa["question"],
                            [a["text"] for a in qa["answers"]],
                            int(qa["answers"][0]["answer_start"]),
                        )
                    )
                    if limit is not None and len(out) >= limit:
                        return out
    except (KeyError, TypeError, ValueError) as e:
        raise MasklabError(f"{path}: malformed SQuAD entry (missing or bad field {e}); expected SQuAD v1.1") from None
    return out


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, articles or extra spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


@dataclass(kw_only=True)
class SquadItem(Example):
    """A SQuAD question as an :class:`~masklab.lab.tasks.base.Example` of the context's sentences,
    ``gold`` the one holding the first answer (read as the studies read stale prompts)."""

    answers: list[str]
    id: str

    def classify(self, generated: str) -> str:
        first = generated.strip().split("\n", 1)[0]
        g = normalize(first)
        return "current" if any(normalize(a) and g.startswith(normalize(a)) for a in self.answers) else "other"

    def is_correct(self, generated: str) -> bool:
        return self.classify(generated) == "current"


def to_item(ex: SquadExample) -> SquadItem:
    sentences = regex_sentences(ex.context)
    gold, pos = 0, 0
    for i, s in enumerate(sentences):
        at = ex.context.find(s[:20], pos)
        if at >= 0 and at <= ex.answer_start:
            gold, pos = i, at
    return SquadItem(units=sentences, gold=[gold], query=Query(ex.question.strip()).text, answers=ex.answers, id=ex.id)
