"""A router as a kvpress press (masklab/context/press.py) inside kvpress's own pipeline: the
prefill sees only the kept tokens, the gold-keeping oracle answers as the study's
oracle-gold does, dropping the gold breaks the answer, a router offered as a press with no
document given finds the context in the prefill itself, and a trained evidence router keeps
the needle. Slow (SmolLM2 at 256 tokens, seconds each)."""

import pytest
import torch

from conftest import needs_kvpress
from masklab.context.router import Router
from masklab.context.routers import ROUTERS  # the registry filled: every product router's file imported
from masklab.lab.routers import factory
from masklab.lab.tasks.longctx import make_example, make_examples, score
from masklab.lab.routers.registry import prune_one

pytestmark = needs_kvpress


@pytest.fixture
def kv(smol):
    from masklab.context.presses import KVPressRunner

    return KVPressRunner(smol)


def ask(kv, ex, press):
    from masklab.text.query import Query

    q = Query.parse(ex.query)
    return kv.answer(ex.context, q.question_line, q.answer_line, press, 1.0, max_new_tokens=10)[0]


class Fixed(Router):
    """Keeps exactly the units it is given (scores 1 there, -1 elsewhere; no fill)."""

    fill = False

    def __init__(self, lm, keep):
        super().__init__(lm)
        self.keep_units = set(keep)

    def score(self, doc, question):
        return torch.tensor([1.0 if i in self.keep_units else -1.0 for i in range(len(doc.units))])


@pytest.mark.slow
def test_press_prefills_only_the_kept_tokens_and_answers_like_the_oracle(smol, kv):
    from masklab.context.answer import generate_answer
    from masklab.context.press import ContextPress

    ex = make_example("niah", 256, 0, smol.tokenizer)
    lengths = ex.lengths(smol.tokenizer)
    oracle = factory("oracle-gold")(lm=smol)
    kept = prune_one(oracle, ex, ex.question, 0.25).kept
    press = ContextPress(
        router=oracle,
        question=ex.question,
        keep=0.25,
        doc=ex,
        prune_doc=lambda d: prune_one(oracle, d, ex.question, 0.25),
    )
    text = ask(kv, ex, press)
    assert press.kept == kept
    dropped = sum(n for i, n in enumerate(lengths) if i not in kept)
    assert press.prefill_tokens == press.context_tokens - dropped  # every dropped sentence's tokens, no others
    assert press.prefill_tokens < 0.35 * press.context_tokens
    study = generate_answer(smol, [ex.units[i] for i in kept], ex.query)  # the same sentences, deleted from the text
    assert score(text, ex) and score(study["generated"], ex)
    assert text.strip() == study["generated"].strip()
    # the same press keeping everything but the gold sentence cannot answer
    no_gold = Fixed(smol, [i for i in range(len(ex.units)) if i not in ex.gold])
    drop_all = ContextPress(
        router=no_gold,
        question=ex.question,
        keep=1.0,
        doc=ex,
        prune_doc=lambda d: prune_one(no_gold, d, ex.question, 1.0),
    )
    assert not score(ask(kv, ex, drop_all), ex)


@pytest.mark.slow
def test_router_press_finds_the_context_itself(smol, kv):
    """``router.press(question, keep)`` with no document: the context is the prefill's
    longest run of ordinary tokens, segmented; the lexical router keeps the needle."""
    ex = make_example("multikey", 256, 1, smol.tokenizer)
    press = ROUTERS["lexical"](lm=smol).press(ex.question, keep=0.25)
    assert score(ask(kv, ex, press), ex)
    assert press.prefill_tokens < 0.4 * press.context_tokens


@pytest.mark.slow
def test_evidence_router_as_a_press_keeps_the_needle(smol, kv):
    from masklab.context.routers.features import features
    from masklab.lab.linear_routers import fit_routers

    train = make_examples("niah", 256, 3, seed=1000, tokenizer=smol.tokenizer)
    feats = [features(smol, ex.units, ex.question) for ex in train]
    fitted = fit_routers(feats, {"evidence": [ex.gold for ex in train]})
    router = ROUTERS["evidence"](lm=smol, routers=fitted, meta={"model": smol.name})
    ex = make_example("niah", 256, 0, smol.tokenizer)
    press = router.press(ex.question, 0.25)
    press.doc = ex
    assert score(ask(kv, ex, press), ex)
    assert press.prefill_tokens < 0.35 * press.context_tokens
