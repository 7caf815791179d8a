"""The tune-prior study's held-out split shares no entity, value type, wording or distance with training."""

from masklab.studies.tune_prior import Config, split_prompts


def test_held_out_split_is_disjoint_from_training():
    cfg = Config()
    train = split_prompts(80, 0, True, cfg)
    test = split_prompts(80, 0, False, cfg)
    assert not {p.entity for p in train} & {p.entity for p in test}
    assert not {p.attribute for p in train} & {p.attribute for p in test}
    fact = lambda ps: {p.sentences[i] for p in ps for i in p.meta["fact_index"]}  # noqa: E731
    strip = lambda s, p: s.replace(p.entity, "{e}")  # noqa: E731
    assert not fact(train) & fact(test)
    assert not {strip(p.query, p) for p in train} & {strip(p.query, p) for p in test}
    gaps = lambda ps: {g for p in ps for g in p.meta["gaps"]}  # noqa: E731
    assert not gaps(train) & gaps(test)
    assert len(split_prompts(10, 1, True, cfg)) == 10
