"""Long-context task generators: gold evidence suffices and is necessary, lengths hit the
target, spans point at the gold sentences, scoring is exact match."""

import pytest

from conftest import needs_smol
from masklab.util.errors import MasklabError
from masklab.lab.tasks.longctx import TASKS, make_example, make_examples, normalise, score, solve, token_offsets

SEEDS = range(6)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"hops": 1, "updates": 1, "distractors": 1, "count": 1},
        {"hops": 5, "updates": 4, "distractors": 6, "count": 7},
    ],
)
def test_gold_suffices_and_is_necessary(task, kw):
    for seed in SEEDS:
        ex = make_example(task, 512, seed, **kw)
        gold = [ex.sentences[g] for g in ex.gold]
        assert solve(task, ex.key, ex.sentences) == ex.answer  # the full context answers
        assert solve(task, ex.key, gold) == ex.answer  # the gold alone suffices
        for g in ex.gold:  # every gold sentence is necessary, in the full context too
            assert solve(task, ex.key, [s for i, s in enumerate(ex.sentences) if i != g]) != ex.answer
            assert solve(task, ex.key, [ex.sentences[h] for h in ex.gold if h != g]) != ex.answer
        filler = [s for i, s in enumerate(ex.sentences) if i not in ex.gold]
        assert solve(task, ex.key, filler) != ex.answer


def test_tasks_have_distractors_the_solver_must_reject():
    mk = make_example("multikey", 512, 0, distractors=3)
    assert len(mk.meta["keys"]) == 4 and sum("magic number" in s for s in mk.sentences) == 4
    vt = make_example("vt", 512, 0, hops=3)
    assert len(vt.gold) == 4 and sum(s.startswith("VAR ") for s in vt.sentences) == 8
    mv = make_example("multivalue", 512, 0, count=3, distractors=2)
    assert len(mv.gold) == 3 and sum("special magic numbers" in s for s in mv.sentences) == 5
    assert mv.answer.split(", ") == mv.meta["values"] and all(
        mv.sentences[g].endswith(f"{v}.") for g, v in zip(mv.gold, mv.meta["values"])
    )
    st = make_example("stale", 512, 0, updates=2)
    assert sum("access code" in s for s in st.sentences) == 3 and ex_answer_is_last(st)


def ex_answer_is_last(ex):
    return ex.answer == ex.meta["values"][-1] and ex.answer not in ex.meta["values"][:-1]


@pytest.mark.parametrize("task", TASKS)
def test_lengths_and_spans(task):
    for n in (512, 1024):
        ex = make_example(task, n, 1)
        assert 0.95 * n <= ex.n_tokens <= n
        ctx = ex.context
        for g, (a, b) in zip(ex.gold, ex.gold_spans):
            assert ctx[a:b] == ex.sentences[g]
        offs = token_offsets(None, ctx)
        for (a, b), (ta, tb) in zip(ex.gold_spans, ex.gold_token_spans):
            assert offs[ta][0] == a and offs[tb - 1][1] == b


def test_a_context_longer_than_the_filler_pool_repeats_it_and_keeps_its_facts():
    from masklab.lab.tasks.longctx import distractor_pool

    words = sum(len(s.split()) for s in distractor_pool())
    n = 3 * words  # past the pool's end twice over (tokens here: words and punctuation marks)
    ex = make_example("stale", n, 0)
    assert 0.95 * n <= ex.n_tokens <= n
    filler = [s for s in ex.sentences if s in set(distractor_pool())]
    assert len(filler) > 2 * len(set(filler)) and len(ex.sentences) - len(filler) == 3  # the statement, 2 updates
    assert solve("stale", ex.key, [ex.sentences[g] for g in ex.gold]) == ex.answer
    assert solve("stale", ex.key, filler) is None


def test_seeded_and_varied():
    a, b = make_examples("niah", 512, 3, seed=0), make_examples("niah", 512, 3, seed=0)
    assert [e.prompt for e in a] == [e.prompt for e in b]
    assert len({e.answer for e in a}) == 3 and len({e.gold[0] for e in a}) > 1


def test_scoring():
    ex = make_example("count", 512, 0, count=3)
    assert score(" three.", ex) and score(" 3 marbles", ex) and not score(" 4", ex) and not score("", ex)
    vt = make_example("vt", 512, 0)
    assert score(f" {vt.answer}.", vt) and score(f" VAR XYZ = {vt.answer}", vt)
    assert normalise(" 1234567 is the number") == "1234567"
    mv = make_example("multivalue", 512, 0, count=3)
    a, b, c = mv.meta["values"]
    assert score(f" {c}, {a} and {b}.", mv) and score(f"\n- {a}\n- {b}\n- {c}", mv)
    assert not score(f" {a}, {b}.", mv) and not score(f" {a}.", mv)  # every value, not the first


def test_bad_input():
    with pytest.raises(MasklabError, match="unknown long-context task"):
        make_example("nope", 512, 0)
    with pytest.raises(MasklabError, match="outside"):
        make_example("niah", 1_000_000, 0)


@needs_smol
def test_lengths_in_model_tokens(smol):
    tok = smol.tokenizer
    for task in TASKS:
        for n in (512, 2048, 4096):
            ex = make_example(task, n, 0, tok)
            assert 0.95 * n <= ex.n_tokens <= n
            assert len(tok(ex.prompt, add_special_tokens=False)["input_ids"]) == ex.n_tokens
            ids = tok(ex.context, add_special_tokens=False)["input_ids"]
            for g, (ta, tb) in zip(ex.gold, ex.gold_token_spans):
                assert tok.decode(ids[ta:tb]).strip() == ex.sentences[g]
