"""Stale-fact prompts for real language models, and a plain sentence splitter.

A prompt states a fact (``Maria lives in Lisbon.``), buries it in real-text distractor
sentences, overwrites it one or more times (``Later, Maria moved to Oslo.``), and asks for
the current value with an answer prefix the model completes (``... Answer: Maria lives
in``). Everything varies with the seed: the entity, the attribute and its value type
(city, colour, job, pet name, number), the wording of statements and updates, the number
of updates (1-3), and the distances (distractor sentences between the statements and
before the question). Distractors are sentences of CPython's own documentation text
(``pydoc_data.topics``, part of the standard library), filtered to plain prose.

Scoring is exact match: the generated continuation, cut at the first punctuation mark or
line break, must equal the current value (case-insensitive); it is ``stale`` when it
equals an earlier value and ``other`` otherwise.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from masklab.lab.tasks.base import Example, pieces_at_stops
from masklab.text.query import Query, answer_head

NAMES = [
    "Maria",
    "Omar",
    "Priya",
    "Lena",
    "Tomas",
    "Aiko",
    "Daniel",
    "Fatima",
    "Jonas",
    "Chen",
    "Sofia",
    "Kwame",
    "Elena",
    "Mateo",
    "Nadia",
    "Victor",
    "Hana",
    "Lucas",
    "Amara",
    "Ivan",
]


@dataclass(frozen=True)
class Attribute:
    """One kind of fact: how it is stated, updated and asked, and its possible values."""

    name: str
    statements: tuple[str, ...]  # "{e}" entity, "{v}" value
    updates: tuple[str, ...]
    question: str
    answer_prefix: str
    values: tuple[str, ...]


ATTRIBUTES = [
    Attribute(
        "city",
        ("{e} lives in {v}.", "{e} has an apartment in {v} and lives there.", "{e} settled in {v}."),
        (
            "Later, {e} moved to {v}.",
            "{e} has since relocated to {v}.",
            "Update: {e} now lives in {v}.",
            "After that, {e} left for {v} and lives there now.",
        ),
        "In which city does {e} live now?",
        "{e} lives in",
        (
            "Lisbon",
            "Oslo",
            "Madrid",
            "Vienna",
            "Dublin",
            "Prague",
            "Berlin",
            "Tokyo",
            "Cairo",
            "Lima",
            "Warsaw",
            "Athens",
            "Nairobi",
            "Toronto",
            "Seoul",
            "Helsinki",
            "Chicago",
            "Sydney",
        ),
    ),
    Attribute(
        "colour",
        ("{e} owns a {v} car.", "{e} drives a {v} car.", "The car that {e} owns is {v}."),
        (
            "Later, {e} had the car painted {v}.",
            "{e} has since repainted the car {v}.",
            "Update: {e}'s car is now {v}.",
        ),
        "What colour is {e}'s car now?",
        "{e}'s car is",
        ("red", "blue", "green", "yellow", "black", "white", "purple", "silver", "brown"),
    ),
    Attribute(
        "job",
        ("{e} works as a {v}.", "{e} has a job as a {v}.", "By profession, {e} is a {v}."),
        (
            "Later, {e} changed careers and became a {v}.",
            "{e} has since retrained as a {v}.",
            "Update: {e} now works as a {v}.",
        ),
        "What is {e}'s job now?",
        "{e} works as a",
        (
            "teacher",
            "pilot",
            "nurse",
            "baker",
            "lawyer",
            "farmer",
            "dentist",
            "chef",
            "painter",
            "plumber",
            "journalist",
            "pharmacist",
            "librarian",
            "carpenter",
        ),
    ),
    Attribute(
        "pet",
        ("{e} has a dog named {v}.", "{e}'s dog is called {v}.", "{e} owns a dog whose name is {v}."),
        (
            "Later, {e} renamed the dog {v}.",
            "{e}'s dog has since been renamed {v}.",
            "Update: {e}'s dog is now called {v}.",
        ),
        "What is the name of {e}'s dog now?",
        "{e}'s dog is called",
        ("Rex", "Bella", "Luna", "Charlie", "Daisy", "Milo", "Rocky", "Buddy", "Coco", "Bruno", "Rusty", "Ziggy"),
    ),
    Attribute(
        "number",
        (
            "The code of {e}'s locker is {v}.",
            "{e}'s locker opens with the code {v}.",
            "{e} set the locker code to {v}.",
        ),
        (
            "Later, {e} changed the locker code to {v}.",
            "{e} has since reset the locker code to {v}.",
            "Update: the code of {e}'s locker is now {v}.",
        ),
        "What is the code of {e}'s locker now?",
        "The code of {e}'s locker is",
        tuple(str(n) for n in (4172, 3859, 9021, 6604, 2738, 5316, 8490, 1967, 7253, 3085, 6941, 2506)),
    ),
]
ATTRIBUTE_NAMES = [a.name for a in ATTRIBUTES]


@lru_cache(maxsize=1)
def distractor_pool() -> tuple[str, ...]:
    """Plain prose sentences from CPython's documentation text (``pydoc_data.topics``)."""
    from pydoc_data.topics import topics

    text = " ".join(topics[k] for k in sorted(topics))
    out = set()
    for s in pieces_at_stops(text):
        if (
            40 <= len(s) <= 160
            and s[0].isupper()
            and s.endswith(".")
            and "e.g." not in s
            and "i.e." not in s
            and "--" not in s
            and not re.search(r"[`*:=\[\]{}()<>|\\\"#_;]", s)
            and not re.search(r"\d", s)
            and not re.match(r"[A-Z]\w* [A-Z]", s)
        ):  # drops headings run into a sentence
            out.add(s)
    return tuple(sorted(out))


@dataclass(kw_only=True)
class StalePrompt(Example):
    """One prompt: an :class:`~masklab.lab.tasks.base.Example` whose ``units`` are its sentences
    (the evidence-search unit) and whose ``gold`` is ``[the sentence with the current
    value]``; ``prompt = context + query``; value spans are character offsets into ``prompt``."""

    entity: str
    attribute: str
    values: list[str]  # values in the order stated; the last is current
    stale_spans: list[tuple[int, int]]  # every mention of an earlier value
    current_spans: list[tuple[int, int]]
    n_updates: int
    distance: int  # distractor sentences between the last stale mention and the current one
    meta: dict = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return self.context + self.query

    @property
    def current(self) -> str:
        return self.values[-1]

    def to_dict(self) -> dict:
        return asdict(self)

    def classify(self, generated: str) -> str:
        return score_answer(generated, self)

    def is_correct(self, generated: str) -> bool:
        """Whether ``generated`` names the current value (:meth:`classify` is ``"current"``)."""
        return self.classify(generated) == "current"


def make_prompt(
    rng: random.Random,
    *,
    updates: tuple[int, int] = (1, 3),
    filler: tuple[int, int] = (0, 6),
    attribute: str | None = None,
) -> StalePrompt:
    """One stale-fact prompt; ``updates`` and ``filler`` are inclusive ranges (number of
    updates; distractor sentences in each gap)."""
    attr = next(a for a in ATTRIBUTES if a.name == attribute) if attribute else rng.choice(ATTRIBUTES)
    entity = rng.choice(NAMES)
    n_up = rng.randint(*updates)
    values = rng.sample(list(attr.values), n_up + 1)
    pool = distractor_pool()
    fact_sents = [rng.choice(attr.statements).format(e=entity, v=values[0])]
    fact_sents += [rng.choice(attr.updates).format(e=entity, v=v) for v in values[1:]]
    gaps = [rng.randint(*filler) for _ in range(len(fact_sents) + 1)]
    fill = iter(rng.sample(pool, sum(gaps)))  # no distractor twice in one prompt
    sentences: list[str] = []
    fact_index: list[int] = []
    for i, fs in enumerate(fact_sents):
        sentences += [next(fill) for _ in range(gaps[i])]
        fact_index.append(len(sentences))
        sentences.append(fs)
    sentences += [next(fill) for _ in range(gaps[-1])]
    query = Query(attr.question.format(e=entity), attr.answer_prefix.format(e=entity)).text
    p = StalePrompt(
        units=sentences,
        gold=[fact_index[-1]],
        query=query,
        entity=entity,
        attribute=attr.name,
        values=values,
        stale_spans=[],
        current_spans=[],
        n_updates=n_up,
        distance=fact_index[-1] - fact_index[-2] - 1,
        meta={"gaps": gaps, "fact_index": fact_index},
    )
    # character spans of every value mention inside its fact sentence
    starts, pos = [], 0
    for s in sentences:
        starts.append(pos)
        pos += len(s) + 1
    for k, (idx, v) in enumerate(zip(fact_index, values)):
        a = starts[idx] + sentences[idx].index(v)
        (p.current_spans if k == len(values) - 1 else p.stale_spans).append((a, a + len(v)))
    return p


def make_prompts(n: int, seed: int = 0, **kw) -> list[StalePrompt]:
    rng = random.Random(seed)
    return [make_prompt(rng, **kw) for _ in range(n)]


def score_answer(generated: str, prompt: StalePrompt) -> str:
    """``current`` / ``stale`` / ``other`` by exact match of the first word(s) generated;
    ``empty`` when nothing but whitespace, punctuation or special tokens was generated."""
    head = answer_head(generated).lower()
    if not head:
        return "empty"
    if head == prompt.current.lower():
        return "current"
    if head in {v.lower() for v in prompt.values[:-1]}:
        return "stale"
    return "other"
