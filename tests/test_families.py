"""Haystack families (masklab/lab/tasks/families.py): the answering facts are where ``gold`` says,
the splits share no filler, template or question wording, and the answer check needs every
value. No model."""

import pytest

from masklab.util.errors import MasklabError
from masklab.lab.tasks.families import FILLERS, KINDS, SPLITS, TEMPLATES, filler_pool, make_example, split_examples


def test_splits_share_no_family():
    for dim in ("filler", "template", "wording"):
        seen = [set(SPLITS[s][dim]) for s in ("train", "val", "test")]
        assert not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2]), dim
    assert {t for s in SPLITS.values() for t in s["template"]} == set(TEMPLATES)
    assert {f for s in SPLITS.values() for f in s["filler"]} == set(FILLERS)


@pytest.mark.parametrize("filler", FILLERS)
def test_fillers_are_plain_prose_without_digits(filler):
    pool = filler_pool(filler)
    assert len(pool) >= 100
    assert not any(ch.isdigit() for s in pool for ch in s)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_gold_units_hold_the_answer(kind, template):
    ex = make_example("licences", template, "c", kind, 512, seed=3)
    gold = " ".join(ex.units[g] for g in ex.gold)
    assert all(a in gold for a in ex.answers)
    assert len(ex.gold) == {"single": 1, "multikey": 1, "update": 1, "chain": 2, "multi": 3}[kind]
    assert 0.9 * 512 <= ex.n_tokens <= 512
    others = " ".join(u for i, u in enumerate(ex.units) if i not in ex.gold)
    if kind == "update":  # the stale values are stated too, but not in the gold unit
        assert sum(a in others for a in ex.answers) == 0
    assert ex.is_correct(" " + " and ".join(ex.answers) + ".") and not ex.is_correct(" nothing.")
    if kind == "multi":
        assert not ex.is_correct(ex.answers[0])  # every value is needed


def test_split_examples_interleave_kinds_and_are_seeded():
    exs = split_examples("test", 2, 384, seed=1)
    assert [e.kind for e in exs[:5]] == list(KINDS)
    assert {e.filler for e in exs} == {"licences"} and {e.wording for e in exs} == {"c"}
    assert [e.units for e in split_examples("test", 2, 384, seed=1)] == [e.units for e in exs]


def test_digest_names_the_text():
    import dataclasses

    ex = make_example("licences", "date", "c", "chain", 384, seed=2)
    assert ex.digest == make_example("licences", "date", "c", "chain", 384, seed=2).digest
    units = list(ex.units)
    units[ex.gold[0]] = "X."
    for changed in (
        dataclasses.replace(ex, units=units),
        dataclasses.replace(ex, gold=ex.gold[:1]),
        make_example("licences", "date", "c", "chain", 384, seed=3),
    ):
        assert changed.digest != ex.digest


def test_bad_family_is_one_error():
    with pytest.raises(MasklabError, match="unknown template"):
        make_example("pydoc", "colour", "a", "single", 512, 0)
    with pytest.raises(MasklabError, match="unknown filler"):
        make_example("poetry", "word", "a", "single", 512, 0)
