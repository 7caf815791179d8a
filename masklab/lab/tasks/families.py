"""Haystack tasks in *families*, so a router can be trained on some and measured on others.

An example is a :class:`~masklab.text.document.Document` of real prose filler with task
sentences placed at seeded random positions, a question and its answer. Families differ in
what a router could overfit to:

* ``filler`` - the prose around the facts: ``pydoc`` (CPython's documentation topics),
  ``sklearn`` (scikit-learn's estimator docstrings and data set descriptions), ``licences`` (the licence texts of
  masklab's own dependencies: legal prose). Each is filtered to plain sentences without
  digits, so every number in a context belongs to the task;
* ``template`` - what a fact is about, each with several statement wordings: ``number``
  (codes), ``word`` (passwords), ``name`` (who holds a role), ``date`` (when an event is),
  ``place`` (where something is kept);
* ``wording`` - the question's wording set (``a``, ``b``, ``c``), disjoint phrasings;
* ``kind`` - ``single`` (one fact), ``multikey`` (the fact among three of the same template
  about other keys), ``update`` (stated, then changed twice: the latest counts), ``chain``
  (the asked key refers to another key whose fact holds the value: both are needed),
  ``multi`` (three facts that together answer: all are needed).

:data:`SPLITS` fixes which families train a router, which choose its features (``val``)
and which measure it (``test``); they share no filler, template or wording.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

from masklab.lab.tasks.base import bling_fire_sentences
from masklab.text.document import Document, count_tokens
from masklab.util.errors import MasklabError
from masklab.text.query import Query
from masklab.lab.tasks.longctx import fill

FILLERS = ("pydoc", "sklearn", "licences")
KINDS = ("single", "multikey", "update", "chain", "multi")
WORDINGS = ("a", "b", "c")
SPLITS = {
    "train": {
        "filler": ["pydoc"],
        "template": ["number", "word"],
        "wording": ["a"],
        "kind": ["single", "multikey", "update", "chain"],
    },
    "val": {"filler": ["sklearn"], "template": ["name"], "wording": ["b"], "kind": list(KINDS)},
    "test": {"filler": ["licences"], "template": ["date", "place"], "wording": ["c"], "kind": list(KINDS)},
}
LICENCE_PACKAGES = (
    "torch",
    "numpy",
    "matplotlib",
    "scipy",
    "scikit-learn",
    "pillow",
    "safetensors",
    "tqdm",
    "transformers",
    "tokenizers",
)

KEYS_A = [
    "amber",
    "quiet",
    "silver",
    "hollow",
    "crimson",
    "misty",
    "golden",
    "copper",
    "velvet",
    "frozen",
    "lunar",
    "rapid",
]
KEYS_B = [
    "gate",
    "tower",
    "harbor",
    "orchard",
    "lantern",
    "bridge",
    "cellar",
    "meadow",
    "chapel",
    "garden",
    "mill",
    "quarry",
]
FIRST = ["Priya", "Tomas", "Amara", "Kenji", "Lucia", "Omar", "Ingrid", "Mateo", "Zanele", "Aurelio", "Freya", "Dmitri"]
LAST = ["Natarajan", "Okafor", "Lindqvist", "Moreau", "Haddad", "Castillo", "Brennan", "Sato", "Adeyemi", "Novak"]
ROLES = ["treasurer", "head archivist", "chief engineer", "choir director", "harbour master", "head gardener"]
ORGS = ["Orion project", "valley museum", "river guild", "northern observatory", "town orchestra", "glass works"]
EVENTS = ["lantern festival", "spring market", "rowing race", "harvest fair", "chess open", "kite day"]
TOWNS = ["Harwick", "Dunmore", "Castelnau", "Brightwater", "Eskdale", "Valmont", "Rosslare", "Kilburn"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
OBJECTS = ["spare key", "old map", "silver compass", "logbook", "violin", "seed box"]
PLACES = ["blue cupboard", "attic trunk", "boathouse", "wine cellar", "garden shed", "clock tower", "greenhouse"]
WORDS = [
    "lantern",
    "thistle",
    "marble",
    "falcon",
    "juniper",
    "cobalt",
    "saffron",
    "pebble",
    "walnut",
    "harbor",
    "quartz",
]

# template -> (key maker, value maker, statement wordings, update wordings, question wordings by set)
TEMPLATES: dict[str, dict] = {
    "number": {
        "state": [
            "The access number for the {k} is {v}.",
            "Remember that the code of the {k} is {v}.",
            "For the {k}, the number to use is {v}.",
        ],
        "update": ["Later, the access number for the {k} was changed to {v}."],
        "chain": "The access number for the {k} is the same as the one for the {k2}.",
        "multi": "One of the numbers for the {k} is {v}.",
        "ask": {
            "a": "What is the access number for the {k}?",
            "b": "Which number opens the {k}?",
            "c": "Tell me the code of the {k}.",
        },
        "ask_multi": {
            "a": "What are the numbers for the {k}?",
            "b": "List the numbers of the {k}.",
            "c": "Which numbers belong to the {k}?",
        },
        "prefix": "The access number for the {k} is",
        "prefix_multi": "The numbers for the {k} are",
    },
    "word": {
        "state": [
            "The password for the {k} is {v}.",
            "To enter the {k}, say the word {v}.",
            "The secret word of the {k} is {v}.",
        ],
        "update": ["Later, the password for the {k} was changed to {v}."],
        "chain": "The password for the {k} is the same as the password for the {k2}.",
        "multi": "One of the words that open the {k} is {v}.",
        "ask": {
            "a": "What is the password for the {k}?",
            "b": "Which word lets you into the {k}?",
            "c": "Tell me the secret word of the {k}.",
        },
        "ask_multi": {
            "a": "What are the words that open the {k}?",
            "b": "List the words for the {k}.",
            "c": "Which words open the {k}?",
        },
        "prefix": "The password for the {k} is",
        "prefix_multi": "The words that open the {k} are",
    },
    "name": {
        "state": [
            "The {k} is {v}.",
            "Everyone knows that {v} works as the {k}.",
            "Since last year, {v} has served as the {k}.",
        ],
        "update": ["Later, {v} took over as the {k}."],
        "chain": "The {k} is the same person as the {k2}.",
        "multi": "One of the members of the {k} is {v}.",
        "ask": {"a": "Who is the {k}?", "b": "Which person serves as the {k}?", "c": "Tell me the name of the {k}."},
        "ask_multi": {
            "a": "Who are the members of the {k}?",
            "b": "List the members of the {k}.",
            "c": "Which people belong to the {k}?",
        },
        "prefix": "The {k} is",
        "prefix_multi": "The members of the {k} are",
    },
    "date": {
        "state": [
            "The {k} takes place on {v}.",
            "This year the {k} is held on {v}.",
            "Mark your calendar: the {k} is on {v}.",
        ],
        "update": ["Later, the {k} was moved to {v}."],
        "chain": "The {k} takes place on the same day as the {k2}.",
        "multi": "One of the days of the {k} is {v}.",
        "ask": {
            "a": "When does the {k} take place?",
            "b": "On which day is the {k} held?",
            "c": "Tell me the date of the {k}.",
        },
        "ask_multi": {
            "a": "On which days is the {k}?",
            "b": "List the days of the {k}.",
            "c": "Which dates does the {k} have?",
        },
        "prefix": "The {k} takes place on",
        "prefix_multi": "The days of the {k} are",
    },
    "place": {
        "state": [
            "The {k} is kept in the {v}.",
            "You will find the {k} in the {v}.",
            "Nobody moves the {k} from the {v}.",
        ],
        "update": ["Later, the {k} was moved to the {v}."],
        "chain": "The {k} is kept in the same place as the {k2}.",
        "multi": "One of the places where a {k} is kept is the {v}.",
        "ask": {"a": "Where is the {k} kept?", "b": "In which place is the {k}?", "c": "Tell me where the {k} is."},
        "ask_multi": {
            "a": "Where are the {k}s kept?",
            "b": "List the places of the {k}s.",
            "c": "In which places are the {k}s?",
        },
        "prefix": "The {k} is kept in the",
        "prefix_multi": "The {k}s are kept in",
    },
}


def _key(template: str, rng: random.Random) -> str:
    if template == "name":
        return f"{rng.choice(ROLES)} of the {rng.choice(ORGS)}"
    if template == "date":
        return f"{rng.choice(EVENTS)} in {rng.choice(TOWNS)}"
    if template == "place":
        return f"{rng.choice(OBJECTS)} of {rng.choice(FIRST)}"
    return f"{rng.choice(KEYS_A)} {rng.choice(KEYS_B)}"


def _value(template: str, rng: random.Random) -> str:
    if template == "number":
        return str(rng.randrange(10_000, 100_000))
    if template == "word":
        return rng.choice(WORDS)
    if template == "name":
        return f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    if template == "date":
        return f"{rng.randint(2, 28)} {rng.choice(MONTHS)}"
    return rng.choice(PLACES)


# --------------------------------------------------------------------------- filler
def _plain_sentences(text: str) -> list[str]:
    """Plain prose sentences: 40-160 characters, capitalised, ending in a full stop, with
    no digits, markup or code characters."""
    out = set()
    for s in bling_fire_sentences(text):
        if (
            40 <= len(s) <= 160
            and s[0].isupper()
            and s.endswith(".")
            and "e.g." not in s
            and "i.e." not in s
            and not re.search(r"[`*:=\[\]{}()<>|\\\"#_;/@$%^~+]|--|\d", s)
            and s.count(".") == 1
        ):
            out.add(s)
    return sorted(out)


@lru_cache(maxsize=None)
def filler_pool(name: str) -> tuple[str, ...]:
    """The filler sentences of corpus ``name`` (module docstring), sorted."""
    if name == "pydoc":
        from masklab.lab.tasks.stale_prompts import distractor_pool

        return distractor_pool()
    if name == "sklearn":
        from pathlib import Path

        import sklearn.datasets
        from sklearn.utils import all_estimators

        folder = Path(sklearn.datasets.__file__).parent / "descr"
        text = [c.__doc__ or "" for _, c in all_estimators()] + [p.read_text() for p in sorted(folder.glob("*.rst"))]
        return tuple(_plain_sentences(" ".join(text)))
    if name == "licences":
        import importlib.metadata as md

        texts = []
        for pkg in LICENCE_PACKAGES:
            try:
                files = md.distribution(pkg).files or []
            except md.PackageNotFoundError:
                continue
            for f in files:
                if f.name.upper().startswith(("LICENSE", "LICENCE", "COPYING")):
                    try:
                        texts.append(f.read_text())
                    except (OSError, UnicodeDecodeError):
                        continue
        return tuple(_plain_sentences(" ".join(texts)))
    raise MasklabError(f"unknown filler {name!r}; choose from {', '.join(FILLERS)}")


# --------------------------------------------------------------------------- examples
@dataclass(kw_only=True)
class FamilyExample(Document):
    """One example: ``units`` (filler + facts), ``gold`` (the facts needed), ``question``,
    ``answers`` (every value the answer must name), the answer ``prefix`` the model
    completes (as RULER's tasks give one) and its families."""

    question: str
    answers: list[str]
    prefix: str
    filler: str
    template: str
    wording: str
    kind: str
    n_tokens: int
    seed: int
    meta: dict = field(default_factory=dict)

    @property
    def query(self) -> str:
        return Query(self.question, self.prefix).text

    @property
    def digest(self) -> str:
        """12 hex digits of sha256 over the example's text, gold and answers: a label or
        held-out row stored with another digest was made from other text (a changed
        generator) and is never reused."""
        text = json.dumps([self.units, self.gold, self.question, self.answers, self.prefix])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def is_correct(self, generated: str) -> bool:
        """Every answer value's first word appears in the first line of ``generated``."""
        line = generated.strip().split("\n")[0].lower()
        words = set(re.findall(r"[a-z0-9]+", line))
        return all(a.split()[0].lower() in words for a in self.answers)


def _facts(
    template: str, kind: str, wording: str, rng: random.Random
) -> tuple[list[str], list[bool], str, list[str], str]:
    t = TEMPLATES[template]
    state = lambda k, v: rng.choice(t["state"]).format(k=k, v=v)  # noqa: E731
    keys: list[str] = []
    while len(keys) < 4:
        k = _key(template, rng)
        if k not in keys:
            keys.append(k)
    vals: list[str] = []
    while len(vals) < 4:
        v = _value(template, rng)
        if v not in vals:
            vals.append(v)
    k = keys[0]
    question, prefix = t["ask"][wording].format(k=k), t["prefix"].format(k=k)
    prefix = prefix[0].upper() + prefix[1:]
    if kind == "single":
        return [state(k, vals[0])], [True], question, [vals[0]], prefix
    if kind == "multikey":
        facts = [state(kk, vv) for kk, vv in zip(keys, vals)]
        order = list(range(4))
        rng.shuffle(order)
        return [facts[i] for i in order], [i == 0 for i in order], question, [vals[0]], prefix
    if kind == "update":
        facts = [state(k, vals[0])] + [t["update"][0].format(k=k, v=v) for v in vals[1:3]]
        return facts, [False, False, True], question, [vals[2]], prefix
    if kind == "chain":
        facts = [t["chain"].format(k=k, k2=keys[1]), state(keys[1], vals[0]), state(keys[2], vals[1])]
        order = [0, 1, 2]
        rng.shuffle(order)
        return [facts[i] for i in order], [i < 2 for i in order], question, [vals[0]], prefix
    if kind == "multi":
        facts = [t["multi"].format(k=k, v=v) for v in vals[:3]] + [t["multi"].format(k=keys[1], v=vals[3])]
        order = list(range(4))
        rng.shuffle(order)
        return (
            [facts[i] for i in order],
            [i < 3 for i in order],
            t["ask_multi"][wording].format(k=k),
            vals[:3],
            t["prefix_multi"].format(k=k),
        )
    raise MasklabError(f"unknown task kind {kind!r}; choose from {', '.join(KINDS)}")


def make_example(
    filler: str, template: str, wording: str, kind: str, n_tokens: int, seed: int, tokenizer=None
) -> FamilyExample:
    """One seeded example whose context + query is about ``n_tokens`` long under ``tokenizer``."""
    if template not in TEMPLATES:
        raise MasklabError(f"unknown template {template!r}; choose from {', '.join(TEMPLATES)}")
    if wording not in WORDINGS:
        raise MasklabError(f"unknown wording {wording!r}; choose from {', '.join(WORDINGS)}")
    rng = random.Random(f"{filler}/{template}/{wording}/{kind}/{n_tokens}/{seed}")
    facts, gold_flags, question, answers, prefix = _facts(template, kind, wording, rng)
    pool = list(filler_pool(filler))
    rng.shuffle(pool)
    query = Query(question, prefix).text
    budget = n_tokens - count_tokens(tokenizer, " ".join(facts) + query)
    filler_s = fill(pool, budget, tokenizer, n_tokens)
    slots = sorted(rng.randint(0, len(filler_s)) for _ in facts)
    units, gold, fi = [], [], 0
    for slot, fact, g in zip(slots, facts, gold_flags):
        units += filler_s[fi:slot]
        fi = slot
        if g:
            gold.append(len(units))
        units.append(fact)
    units += filler_s[fi:]
    n = count_tokens(tokenizer, " ".join(units) + query)
    return FamilyExample(
        units=units,
        gold=gold,
        question=question,
        answers=answers,
        prefix=prefix,
        filler=filler,
        template=template,
        wording=wording,
        kind=kind,
        n_tokens=n,
        seed=seed,
    )


def split_examples(
    split: str, n_per_cell: int, n_tokens: int, seed: int = 0, tokenizer=None, kinds: list[str] | None = None
) -> list[FamilyExample]:
    """``n_per_cell`` examples per kind of split ``split`` (:data:`SPLITS`), cycling through
    its fillers, templates and wordings."""
    fam = SPLITS[split]
    out = []
    for i in range(n_per_cell):  # kinds interleaved, so a run stopped early has every kind
        for kind in kinds or fam["kind"]:
            out.append(
                make_example(
                    fam["filler"][i % len(fam["filler"])],
                    fam["template"][i % len(fam["template"])],
                    fam["wording"][i % len(fam["wording"])],
                    kind,
                    n_tokens,
                    seed * 100_003 + i,
                    tokenizer,
                )
            )
    return out
