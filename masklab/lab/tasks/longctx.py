"""RULER-style long-context tasks on real filler text, with gold evidence spans.

Every example is a context made of sentences (the items of evidence search and of
routing): plain prose filler sentences from CPython's documentation text
(:func:`masklab.lab.tasks.stale_prompts.distractor_pool`: no digits, so every number in a
context belongs to the task) with the task's own sentences placed at seeded random
positions, then a question with an answer prefix the model completes::

    ... The special magic number for silver-fox is 4829137. ...
    Question: What is the special magic number for silver-fox?
    Answer: The special magic number for silver-fox is

==========  ================================================================================
task        what the context holds / the gold evidence
==========  ================================================================================
niah        one needle (key -> 7-digit number) / the needle
multikey    the needle plus ``distractors`` needles with other keys / the asked key's needle
vt          variable tracking: a chain of ``hops`` assignments (``VAR QXKPR = 48213.``,
            ``VAR MBZTE = VAR QXKPR.``, ...) and a distractor chain with another value;
            the question asks the value of the chain's last variable / every link of it
multivalue  ``count`` needles with the asked key (``One of the special magic numbers for
            silver-fox is 4829137.``) among ``distractors`` with other keys; the question
            asks for all of them (RULER's multi-value NIAH) / every needle of the key
stale       a key's code stated, then reassigned ``updates`` times; the question asks for
            the latest / the last reassignment
count       aggregation: ``count`` tally sentences (``A red marble was put into the
            jar.``) among other-coloured marbles; how many red marbles / every red tally
==========  ================================================================================

Lengths are in model tokens: ``n_tokens`` is the length of ``context + query`` under the
given tokenizer (without BOS or chat turns), filled to within :data:`TOLERANCE` of the
target. Gold evidence is recorded as sentence indices, character spans into the context
and token spans into the tokenised context (``[start, end)``).

:func:`solve` is a rule-based solver that reads only the sentences it is given: the tests
use it to check that the gold sentences suffice (``solve(gold) == answer``) and are
necessary (``solve(context without one gold sentence) != answer``). :func:`score` is the
exact match of a generated continuation (cut at the first punctuation mark or line break,
case-insensitive).
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field

from masklab.lab.tasks.base import Example
from masklab.text.document import count_tokens, token_offsets
from masklab.util.errors import MasklabError
from masklab.text.query import Query
from masklab.lab.tasks.stale_prompts import answer_head, distractor_pool

TASKS = ("niah", "multikey", "multivalue", "vt", "stale", "count")
TOLERANCE = 0.05  # n_tokens lands within 5% of the target (and at most the target)
MIN_TOKENS, MAX_TOKENS = 256, 32768

ADJECTIVES = [
    "silver",
    "quiet",
    "amber",
    "rapid",
    "hollow",
    "bright",
    "frozen",
    "gentle",
    "lucky",
    "crimson",
    "wooden",
    "misty",
    "golden",
    "brave",
    "sleepy",
    "copper",
    "distant",
    "humble",
    "lunar",
    "velvet",
]
NOUNS = [
    "fox",
    "river",
    "lantern",
    "harbor",
    "meadow",
    "falcon",
    "compass",
    "orchard",
    "glacier",
    "violin",
    "canyon",
    "beacon",
    "willow",
    "summit",
    "pebble",
    "comet",
    "thistle",
    "anchor",
    "prairie",
    "ember",
]
COLOURS = ["red", "blue", "green", "yellow", "white", "black"]

NEEDLE = "The special magic number for {k} is {v}."
NEEDLE_RE = re.compile(r"The special magic number for ([\w-]+) is (\d+)\.")
VALUE = "One of the special magic numbers for {k} is {v}."
VALUE_RE = re.compile(r"One of the special magic numbers for ([\w-]+) is (\d+)\.")
VT_VALUE = "VAR {a} = {v}."
VT_LINK = "VAR {a} = VAR {b}."
VT_RE = re.compile(r"VAR ([A-Z]+) = (?:VAR ([A-Z]+)|(\d+))\.")
STALE_FIRST = "The access code of the {k} locker is {v}."
STALE_UPDATE = "Later, the access code of the {k} locker was changed to {v}."
STALE_RE = re.compile(
    r"(?:The access code of the|Later, the access code of the) ([\w-]+) locker (?:is|was changed to) (\d+)\."
)
TALLY = "A {c} marble was put into the jar."
TALLY_RE = re.compile(r"A (\w+) marble was put into the jar\.")
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


@dataclass(kw_only=True)
class LongExample(Example):
    """One example: an :class:`~masklab.lab.tasks.base.Example` whose ``units`` are the
    context's sentences (``context = " ".join(units)``); the model reads ``context + query``.

    ``gold``: indices of the gold evidence sentences; ``gold_spans``: their character spans
    in ``context``; ``gold_token_spans``: token spans ``[a, b)`` in the tokenised context.
    ``key``: what the question is about (needle key, variable, locker, colour).
    """

    task: str
    answer: str
    key: str
    gold_spans: list[tuple[int, int]]
    gold_token_spans: list[tuple[int, int]]
    n_tokens: int
    target_tokens: int
    seed: int
    meta: dict = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return self.context + self.query

    def is_correct(self, answer: str) -> bool:
        """Whether a generated ``answer`` is right (:func:`score`)."""
        return score(answer, self)

    def to_dict(self) -> dict:
        return asdict(self)


def token_spans(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """For each character span ``[s, e)``: the token span ``[a, b)`` of the tokens overlapping it."""
    out = []
    for s, e in spans:
        hit = [t for t, (a, b) in enumerate(offsets) if b > a and a < e and s < b]
        out.append((hit[0], hit[-1] + 1) if hit else (0, 0))
    return out


# --------------------------------------------------------------------------- task sentences
def _keys(rng: random.Random, n: int) -> list[str]:
    pairs = rng.sample([(a, b) for a in ADJECTIVES for b in NOUNS], n)
    return [f"{a}-{b}" for a, b in pairs]


def _numbers(rng: random.Random, n: int, digits: int) -> list[str]:
    lo = 10 ** (digits - 1)
    out: list[str] = []
    while len(out) < n:
        v = str(rng.randrange(lo, 10 * lo))
        if v not in out:
            out.append(v)
    return out


def _var_names(rng: random.Random, n: int) -> list[str]:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    out: list[str] = []
    while len(out) < n:
        v = "".join(rng.choice(letters) for _ in range(5))
        if v not in out:
            out.append(v)
    return out


@dataclass
class _Plan:
    """Task sentences in reading order; ``gold`` marks the evidence; ``ordered``: whether the
    sentences must keep their relative order (chains, updates)."""

    facts: list[str]
    gold: list[bool]
    query: str
    answer: str
    key: str
    meta: dict


def _plan(task: str, rng: random.Random, *, distractors: int, hops: int, updates: int, count: int) -> _Plan:
    if task in ("niah", "multikey"):
        n = 1 + (distractors if task == "multikey" else 0)
        keys, vals = _keys(rng, n), _numbers(rng, n, 7)
        facts = [NEEDLE.format(k=k, v=v) for k, v in zip(keys, vals)]
        order = list(range(n))
        rng.shuffle(order)
        k = keys[0]
        return _Plan(
            [facts[i] for i in order],
            [i == 0 for i in order],
            Query(f"What is the special magic number for {k}?", f"The special magic number for {k} is").text,
            vals[0],
            k,
            {"keys": keys},
        )
    if task == "multivalue":
        keys = _keys(rng, 1 + distractors)
        vals = _numbers(rng, count + distractors, 7)
        owners = [keys[0]] * count + keys[1:]
        rng.shuffle(owners)
        facts = [VALUE.format(k=k, v=v) for k, v in zip(owners, vals)]
        k = keys[0]
        mine = [v for o, v in zip(owners, vals) if o == k]
        return _Plan(
            facts,
            [o == k for o in owners],
            Query(f"What are all the special magic numbers for {k}?", f"The special magic numbers for {k} are").text,
            ", ".join(mine),
            k,
            {"keys": keys, "values": mine},
        )
    if task == "vt":
        names = _var_names(rng, 2 * (hops + 1))
        vals = _numbers(rng, 2, 5)
        chains = []
        for c in range(2):
            vs = names[c * (hops + 1) : (c + 1) * (hops + 1)]
            chains.append(
                [VT_VALUE.format(a=vs[0], v=vals[c])] + [VT_LINK.format(a=vs[i + 1], b=vs[i]) for i in range(hops)]
            )
        # interleave the two chains, each in its own order
        slots = [0] * len(chains[0]) + [1] * len(chains[1])
        rng.shuffle(slots)
        its = [iter(chains[0]), iter(chains[1])]
        facts = [next(its[s]) for s in slots]
        last = names[hops]
        return _Plan(
            facts,
            [s == 0 for s in slots],
            Query(f"What is the value of VAR {last}?", f"VAR {last} =").text,
            vals[0],
            last,
            {"chain": names[: hops + 1], "distractor_chain": names[hops + 1 :], "distractor_value": vals[1]},
        )
    if task == "stale":
        k = _keys(rng, 1)[0]
        vals = _numbers(rng, updates + 1, 4)
        facts = [STALE_FIRST.format(k=k, v=vals[0])] + [STALE_UPDATE.format(k=k, v=v) for v in vals[1:]]
        return _Plan(
            facts,
            [i == len(facts) - 1 for i in range(len(facts))],
            Query(f"What is the access code of the {k} locker now?", f"The access code of the {k} locker is").text,
            vals[-1],
            k,
            {"values": vals},
        )
    if task == "count":
        colour, *others = rng.sample(COLOURS, 3)
        n_other = rng.randint(1, 3)
        tallies = [colour] * count + [rng.choice(others) for _ in range(n_other)]
        rng.shuffle(tallies)
        return _Plan(
            [TALLY.format(c=c) for c in tallies],
            [c == colour for c in tallies],
            Query(f"How many {colour} marbles were put into the jar?", f"The number of {colour} marbles is").text,
            str(count),
            colour,
            {"tallies": tallies},
        )
    raise MasklabError(f"unknown long-context task {task!r}: use one of {', '.join(TASKS)}")


# --------------------------------------------------------------------------- generation
def fill(pool: list[str], budget: int, tokenizer, n_tokens: int) -> list[str]:
    """Filler sentences from ``pool`` in its order, first fit (a sentence too long for what is
    left is skipped), until ``budget`` tokens are used to within ``max(24, TOLERANCE * n_tokens)``.
    Past the end of the pool it starts again: long contexts repeat their filler, as RULER's long
    haystacks do; a context the pool fills once is what it was before repeats existed."""
    filler: list[str] = []
    used = 0
    while True:
        before = used
        for s in pool:
            c = count_tokens(tokenizer, " " + s)
            if used + c <= budget:
                filler.append(s)
                used += c
            if budget - used < 6:
                break
        if budget - used <= max(24, TOLERANCE * n_tokens):
            return filler
        if used == before:
            raise MasklabError(f"the filler text is too short for {n_tokens} tokens")


def make_example(
    task: str,
    n_tokens: int,
    seed: int,
    tokenizer=None,
    *,
    distractors: int = 3,
    hops: int = 3,
    updates: int = 2,
    count: int = 3,
) -> LongExample:
    """One seeded example of ``task`` whose ``context + query`` is ``n_tokens`` long under
    ``tokenizer`` (a Hugging Face tokenizer; None counts words and punctuation marks)."""
    if task not in TASKS:
        raise MasklabError(f"unknown long-context task {task!r}: use one of {', '.join(TASKS)}")
    if not MIN_TOKENS <= n_tokens <= MAX_TOKENS:
        raise MasklabError(f"context length {n_tokens} is outside {MIN_TOKENS}..{MAX_TOKENS} tokens")
    rng = random.Random(f"{task}/{n_tokens}/{seed}")
    plan = _plan(task, rng, distractors=distractors, hops=hops, updates=updates, count=count)
    pool = list(distractor_pool())
    rng.shuffle(pool)
    fixed = count_tokens(tokenizer, " ".join(plan.facts) + plan.query)
    budget = n_tokens - fixed
    # filler: add sentences by their own token counts, then correct against the exact count
    filler = fill(pool, budget, tokenizer, n_tokens)
    # where the task sentences go: sorted random slots among the filler (order kept)
    slots = sorted(rng.randint(0, len(filler)) for _ in plan.facts)
    sentences: list[str] = []
    gold: list[int] = []
    fi = 0
    for slot, fact, g in zip(slots, plan.facts, plan.gold):
        sentences += filler[fi:slot]
        fi = slot
        if g:
            gold.append(len(sentences))
        sentences.append(fact)
    sentences += filler[fi:]
    # exact length; drop filler sentences (never task sentences) while too long
    facts = set(plan.facts)
    n = count_tokens(tokenizer, " ".join(sentences) + plan.query)
    while n > n_tokens:
        drop = max(i for i, s in enumerate(sentences) if s not in facts)
        sentences.pop(drop)
        gold = [g - (g > drop) for g in gold]
        n = count_tokens(tokenizer, " ".join(sentences) + plan.query)
    starts, pos = [], 0
    for s in sentences:
        starts.append(pos)
        pos += len(s) + 1
    spans = [(starts[g], starts[g] + len(sentences[g])) for g in gold]
    context = " ".join(sentences)
    tspans = token_spans(token_offsets(tokenizer, context), spans)
    return LongExample(
        units=sentences,
        gold=gold,
        task=task,
        query=plan.query,
        answer=plan.answer,
        key=plan.key,
        gold_spans=spans,
        gold_token_spans=tspans,
        n_tokens=n,
        target_tokens=n_tokens,
        seed=seed,
        meta=plan.meta,
    )


def make_examples(task: str, n_tokens: int, n: int, seed: int = 0, tokenizer=None, **kw) -> list[LongExample]:
    return [make_example(task, n_tokens, seed * 100_003 + i, tokenizer, **kw) for i in range(n)]


# --------------------------------------------------------------------------- solving and scoring
def solve(task: str, key: str, sentences: list[str]) -> str | None:
    """The answer derivable from ``sentences`` alone by the task's rule, or None when it is
    not derivable (missing or ambiguous). ``key`` is :attr:`LongExample.key`."""
    text = " ".join(sentences)
    if task in ("niah", "multikey"):
        found = {v for k, v in NEEDLE_RE.findall(text) if k == key}
        return found.pop() if len(found) == 1 else None
    if task == "multivalue":
        found = [v for k, v in VALUE_RE.findall(text) if k == key]
        return ", ".join(found) if found else None
    if task == "vt":
        assign: dict[str, list[str]] = {}
        for a, b, v in VT_RE.findall(text):
            assign.setdefault(a, []).append(b or v)
        name, seen = key, set()
        while True:
            vals = assign.get(name, [])
            if len(vals) != 1 or name in seen:
                return None
            seen.add(name)
            if vals[0].isdigit():
                return vals[0]
            name = vals[0]
    if task == "stale":
        found = [v for k, v in STALE_RE.findall(text) if k == key]
        return found[-1] if found else None
    if task == "count":
        n = sum(1 for c in TALLY_RE.findall(text) if c == key)
        return str(n) if n else None
    raise MasklabError(f"unknown long-context task {task!r}: use one of {', '.join(TASKS)}")


def normalise(text: str) -> str:
    """The scored head of a continuation, lower-cased; a number word becomes its digits."""
    head = answer_head(text).lower().strip()
    head = re.sub(r"^(?:var\s+[a-z]+\s*=\s*)", "", head)
    head = head.split()[0] if head else ""
    return str(NUMBER_WORDS.index(head)) if head in NUMBER_WORDS else head


def score(generated: str, example: LongExample) -> bool:
    """Exact match of the normalised continuation with the answer; ``multivalue``: every
    value of the key is among the continuation's numbers (in any order)."""
    if example.task == "multivalue":
        return set(example.answer.split(", ")) <= set(re.findall(r"\d+", generated))
    return normalise(generated) == example.answer.lower()
