"""masklab.pretrained.hf: priors and per-layer/head hiding on Hugging Face models (tiny random Llama and
Gemma 3 configs; the real SmolLM2 when its package is installed)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoModelForCausalLM, GPT2Config  # noqa: E402

from conftest import tiny_model  # noqa: E402
from masklab.priors.bias import MaskPrior, RelativePrior, relative_buckets  # noqa: E402
from masklab.pretrained.hf import (
    attach_priors,
    detach_priors,
    hide,
    load_priors,
    masklab_attention,  # noqa: E402
    priors_of,
    save_priors,
)
from masklab.lab.runner import MasklabError  # noqa: E402

torch.set_num_threads(1)
VOCAB = 64


def tiny(kind: str) -> torch.nn.Module:
    """A 2-layer random model, grouped KV heads (4 query heads, 2 KV heads); Gemma 3's layer 0
    slides over 4 tokens: shorter than every test sequence."""
    return tiny_model({"llama": "llama", "gemma": "gemma3_text"}[kind], VOCAB)


def rel(layer: int, heads: int) -> RelativePrior:
    return RelativePrior(heads, max_distance=16, exact=4, log_buckets=4)


def scramble(model: torch.nn.Module, seed: int = 1) -> None:
    """Give every attached prior a non-trivial pattern."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in priors_of(model):
            p.theta.copy_(torch.randn(p.theta.shape, generator=g) * 3)


def ids(batch: int = 2, seq: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


KINDS = ["llama", "gemma"]


# --------------------------------------------------------------------------- RelativePrior / MaskPrior crop
def test_relative_buckets_exact_then_log_spaced():
    d = torch.arange(0, 40)
    b = relative_buckets(d, exact=4, max_distance=16, n_log=4)
    assert b[:4].tolist() == [0, 1, 2, 3]
    assert (b[4:].diff() >= 0).all() and b.max() == 7 and (b[16:] == 7).all()
    assert len(set(b[4:16].tolist())) == 4  # all log buckets used below max_distance
    assert relative_buckets(torch.tensor([-3]), 4, 16, 4).item() == 0


def test_relative_prior_crop_matches_square_and_any_length():
    p = RelativePrior(3, max_distance=16, exact=4, log_buckets=4)
    with torch.no_grad():
        p.theta.normal_()
    full = p(50)
    assert full.shape == (3, 50, 50)
    assert torch.equal(p(5, 50, 45), full[:, 45:, :])
    assert torch.equal(p(1, 30, 29), full[:, 29:30, :30])
    assert (full <= 0).all()


def test_mask_prior_rectangular_crop():
    s = (torch.rand(2, 10, 10) > 0.5).float()
    for mode in ("learnable", "hard"):
        p = MaskPrior(s, mode=mode)
        full = p(10)
        assert torch.equal(p(3, 9, 6), full[:, 6:9, :9])
        assert torch.equal(p(6), p(6, 6, 0))
    with pytest.raises(ValueError):
        MaskPrior(s)(3, 10, 8)


# --------------------------------------------------------------------------- attach / detach
# (attach, detach, gradients, generation and hiding on every architecture: tests/test_architectures.py)
@pytest.mark.parametrize("kind", KINDS)
def test_output_attentions_returns_probabilities_with_the_prior(kind):
    m = tiny(kind)
    attach_priors(m, rel)
    scramble(m)
    x = ids()
    with torch.no_grad(), pytest.warns(UserWarning):
        out = m(x, output_attentions=True)
        plain = m(x).logits
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 12, 12)
    torch.testing.assert_close(out.attentions[1].sum(-1), torch.ones(2, 4, 12))
    assert out.attentions[1].triu(1).abs().max() == 0  # causal
    torch.testing.assert_close(out.logits, plain, atol=1e-5, rtol=1e-5)
    if kind == "gemma":  # the sliding layer sees only the last 4 keys
        assert out.attentions[0][..., 8:, :4].abs().max() == 0


def test_unsupported_architecture_is_one_clear_error():
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)
    m = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(MasklabError, match="llama.*gemma3_text"):
        attach_priors(m, rel)
    with pytest.raises(MasklabError, match="not supported"):
        with hide(m, spans=[(0, 1)]):
            pass


def test_attach_twice_and_detach_without_priors_are_errors():
    m = tiny("llama")
    with pytest.raises(MasklabError, match="no priors"):
        detach_priors(m)
    with pytest.raises(MasklabError, match="not an nn.Module"):
        attach_priors(m, lambda i, h: rel(i, h) if i == 0 else None)
    assert not priors_of(m) and m.config._attn_implementation == "sdpa"
    attach_priors(m, rel)
    with pytest.raises(MasklabError, match="already"):
        attach_priors(m, rel)


# --------------------------------------------------------------------------- hide
def test_hide_per_head_matches_manual_attention():
    """Hiding keys in head 1 of layer 0 only: that head's attention equals a manual softmax
    with those keys removed, the other heads are untouched."""
    m = tiny("llama")
    x = ids(1, 10)
    m.set_attn_implementation("eager")
    with torch.no_grad():
        base = m(x, output_attentions=True).attentions[0]
    with torch.no_grad(), pytest.warns(UserWarning):
        with hide(m, spans=[(2, 5)], layers=[0], heads=[1]):
            got = m(x, output_attentions=True).attentions[0]
    for h in (0, 2, 3):
        torch.testing.assert_close(got[0, h], base[0, h])
    expect = base[0, 1].clone()
    expect[:, 2:5] = 0
    rows = torch.arange(10) >= 5  # queries that still see a key besides the hidden ones
    expect = expect / expect.sum(-1, keepdim=True).clamp_min(1e-30)
    torch.testing.assert_close(got[0, 1][rows], expect[rows], atol=1e-5, rtol=1e-5)


def test_hide_with_priors_keeps_priors_attached():
    m = tiny("llama")
    attach_priors(m, rel)
    with hide(m, spans=[(1, 2)]):
        pass
    assert m.config._attn_implementation == "masklab" and len(priors_of(m)) == 2
    detach_priors(m)
    assert m.config._attn_implementation == "sdpa"


def test_hide_rejects_bad_arguments():
    m = tiny("llama")
    for kw in (
        {},
        {"spans": [(0, 1)], "keep": torch.ones(1, 3, dtype=torch.bool)},
        {"spans": [(0, 1)], "layers": [5]},
        {"spans": [(0, 1)], "heads": [9]},
        {"keep": torch.ones(1, 3)},
    ):
        with pytest.raises(MasklabError):
            with hide(m, **kw):
                pass
    assert m.config._attn_implementation == "sdpa"


# --------------------------------------------------------------------------- kvpress
@pytest.mark.parametrize("kind", KINDS)
def test_kvpress_press_runs_with_priors_attached(kind):
    kvpress = pytest.importorskip("kvpress")
    from kvpress.attention_patch import attention_patch
    from transformers import DynamicCache

    m = tiny(kind)
    attach_priors(m, rel)
    scramble(m)
    x = ids(1, 16)
    # kvpress wraps attention functions and passes dropout positionally
    attn = m.model.layers[1].self_attn
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    a, _ = masklab_attention(attn, q, k, k, None, 0.0, scaling=0.5)
    b, _ = attention_patch(masklab_attention)(attn, q, k, k, None, 0.0, scaling=0.5)
    torch.testing.assert_close(a, b)
    press = kvpress.KnormPress(compression_ratio=0.5)
    with torch.no_grad():
        cache = DynamicCache(config=m.config)
        with press(m):
            m(x, past_key_values=cache, use_cache=True)
        full_layer = 1
        assert cache.layers[full_layer].keys.shape[-2] == 8  # the press pruned half the keys
        with press(m):
            pressed = m.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=3, min_new_tokens=3, do_sample=False
            )
    assert pressed.shape == (1, 19)


# --------------------------------------------------------------------------- files
@pytest.mark.parametrize("kind", KINDS)
def test_priors_file_round_trip(kind, tmp_path):
    m = tiny(kind)
    attach_priors(m, rel)
    scramble(m)
    x = ids()
    with torch.no_grad():
        want = m(x).logits
    path = save_priors(m, tmp_path / "p.safetensors")
    detach_priors(m)
    loaded = load_priors(m, path)
    assert isinstance(loaded[0], RelativePrior) and loaded[0].max_distance == 16
    with torch.no_grad():
        assert torch.equal(m(x).logits, want)
    load_priors(m, path)  # replaces attached priors
    assert len(priors_of(m)) == 2


def test_mask_prior_file_round_trip(tmp_path):
    m = tiny("llama")
    attach_priors(m, lambda i, h: MaskPrior((torch.rand(h, 32, 32) > 0.3).float(), mode="hard"))
    x = ids()
    with torch.no_grad():
        want = m(x).logits
    path = save_priors(m, tmp_path / "m.safetensors")
    detach_priors(m)
    load_priors(m, path)
    with torch.no_grad():
        assert torch.equal(m(x).logits, want)


def test_bad_priors_files_rejected(tmp_path):
    from safetensors.torch import load_file, save_file

    m = tiny("llama")
    attach_priors(m, rel)
    good = save_priors(m, tmp_path / "good.safetensors")
    detach_priors(m)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file at all")
    with pytest.raises(MasklabError, match="not a safetensors"):
        load_priors(m, junk)
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(MasklabError, match="not a masklab priors file"):
        load_priors(m, plain)
    with pytest.raises(MasklabError, match="not found"):
        load_priors(m, tmp_path / "missing.safetensors")
    # wrong shapes: same metadata, a theta with one bucket less
    from safetensors import safe_open

    with safe_open(str(good), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(good))
    tensors["layers.1.theta"] = tensors["layers.1.theta"][:, :-1].contiguous()
    bad = tmp_path / "shape.safetensors"
    save_file(tensors, str(bad), metadata=meta)
    with pytest.raises(MasklabError, match="layer 1 tensor 'theta'"):
        load_priors(m, bad)
    # wrong model: Gemma priors onto Llama, and another model name
    g = tiny("gemma")
    attach_priors(g, rel)
    gp = save_priors(g, tmp_path / "gemma.safetensors")
    with pytest.raises(MasklabError, match="does not fit this model.*model_type"):
        load_priors(m, gp)
    m.config._name_or_path = "other"
    with pytest.raises(MasklabError, match="model_name"):
        load_priors(m, good)
    load_priors(m, good, check_name=False)
    assert len(priors_of(m)) == 2


# --------------------------------------------------------------------------- the real SmolLM2
def test_smollm2_all_allowed_prior_hide_and_generate(smol):
    m = smol.model
    x = smol.tokenizer("The capital of France is Paris. The capital of Italy is", return_tensors="pt").input_ids
    T = x.shape[1]
    with torch.no_grad():
        ref = m(x).logits
        am = torch.ones_like(x)
        am[:, 1:7] = 0
        masked = m(x, attention_mask=am).logits
        with hide(m, spans=[(1, 7)]):
            torch.testing.assert_close(m(x).logits, masked, atol=1e-4, rtol=1e-4)
        attach_priors(m, lambda i, h: RelativePrior(h, max_distance=256))
        try:
            torch.testing.assert_close(m(x).logits, ref, atol=1e-4, rtol=1e-4)
            scramble(m)
            out = m.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=3,
                min_new_tokens=3,
                do_sample=False,
                pad_token_id=smol.tokenizer.pad_token_id,
            )
            for t in range(3):
                assert m(out[:, : T + t]).logits[0, -1].argmax().item() == out[0, T + t].item()
        finally:
            detach_priors(m)
        assert torch.equal(m(x).logits, ref)


def test_smollm2_evidence_oracle_hides_per_layer(smol):
    from masklab.lab.lm_evidence import SentenceOracle

    sents = ["Anna lives in Oslo.", "The sky is blue.", "Anna moved to Rome in 2020."]
    q = "\nQuestion: Where does Anna live now?\nAnswer:"
    mask = SentenceOracle(smol, sents, q, hide="mask")
    everywhere = SentenceOracle(smol, sents, q, hide="layers", answer_ids=mask.answer_ids)
    late = SentenceOracle(smol, sents, q, hide="layers", layers=[20, 21], heads=[0], answer_ids=mask.answer_ids)
    keep = torch.tensor([[True, True, False], [False, True, True], [True, False, True]])
    lp_m, g_m = mask.scores(keep)
    lp_e, g_e = everywhere.scores(keep)
    torch.testing.assert_close(lp_e, lp_m, atol=1e-3, rtol=1e-4)
    assert torch.equal(g_e, g_m)
    lp_l, _ = late.scores(keep)
    assert (lp_l - lp_m).abs().max() > 1e-3  # hiding in two layers' head 0 only is a weaker intervention
    with pytest.raises(MasklabError):
        SentenceOracle(smol, sents, q, hide="mask", layers=[1], answer_ids=mask.answer_ids)


def test_smollm2_evidence_searches_run_on_hide(smol):
    """The registered searches run with per-layer hiding as their intervention; hiding in
    every layer finds the same evidence as the 2-D mask."""
    from masklab.lab.lm_evidence import cite

    sents = ["Omar works as a baker.", "The sky was grey that morning.", "Later, Omar retrained as a pilot."]
    q = "\nQuestion: What is Omar's job now?\nAnswer: Omar works as a"
    for method in ("loo", "group-testing"):
        ref = cite(smol, sents, q, method=method)
        got = cite(smol, sents, q, method=method, hide="layers")
        assert got["evidence"] == ref["evidence"] and got["answer"] == ref["answer"]
    part = cite(smol, sents, q, method="greedy-minimal", hide="layers", layers=list(range(15)))
    assert part["forward_passes"] > 1
