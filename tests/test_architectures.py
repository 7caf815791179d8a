"""Every architecture of masklab.pretrained.arch, as a user's model folder.

Each test loads a tiny random model of one listed architecture (2 layers, width 32, grouped
KV heads; a sliding window of 4 tokens on the layers the architecture slides), saved with a
tiny character-level tokenizer to a temporary folder (tests/conftest.py builds one per kind
per session), through the folder path with :func:`masklab.pretrained.models.load`, as
``--model /path/to/folder`` does.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import CHAR_VOCAB as VOCAB, KINDS, SLIDES, SPECIALS, save_tiny_folder as save_folder  # noqa: E402
from masklab.priors.bias import RelativePrior  # noqa: E402
from masklab.util.errors import MasklabError  # noqa: E402
from masklab.pretrained.hf import attach_priors, detach_priors, hide, priors_of  # noqa: E402
from masklab.pretrained.arch import (
    ARCHITECTURES,
    arch_of,
    attention_modules,
    base_model,  # noqa: E402
    decoder_layers,
    final_norm,
    first_layers,
    kv_heads,
    sliding_window_layers,
)
from masklab.pretrained.models import check_models, load  # noqa: E402

torch.set_num_threads(1)
# a ChatML template with a default system turn, as Qwen2.5's has
CHATML = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nBe brief.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def folders(tiny_folders):
    """kind -> a saved model folder (conftest.py builds them once per session)."""
    return tiny_folders


def rel(layer: int, heads: int) -> RelativePrior:
    return RelativePrior(heads, max_distance=16, exact=4, log_buckets=4)


def scramble(model, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in priors_of(model):
            p.theta.copy_(torch.randn(p.theta.shape, generator=g) * 3)


def ids(batch: int = 2, seq: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(len(SPECIALS), VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- the table
def test_every_listed_architecture_is_in_the_table_and_the_docs():
    from pathlib import Path

    assert set(KINDS) <= set(ARCHITECTURES)
    doc = (Path(__file__).parent.parent / "docs" / "pretrained.md").read_text()
    missing = [k for k in ARCHITECTURES if f"| `{k}` |" not in doc]
    assert not missing, f"docs/pretrained.md's architecture table lacks {missing}"


@pytest.mark.parametrize("kind", KINDS)
def test_folder_loads_and_the_table_finds_its_parts(kind, folders):
    lm = load(str(folders[kind]))
    m = lm.model
    assert m.config.model_type == kind and arch_of(m).model_type == kind and lm.source == "directory"
    assert lm.prompt_format == "raw" and not lm.template_chat  # no chat template: a base model
    base = base_model(m)
    assert base is m.model and decoder_layers(m) is base.layers and len(decoder_layers(m)) == 2
    assert final_norm(m) is base.norm
    assert [a for a in attention_modules(m)] == [layer.self_attn for layer in base.layers]
    assert kv_heads(m) == 2 and sliding_window_layers(m) == SLIDES[kind]
    x = ids()
    with torch.no_grad():
        out = m(x, output_hidden_states=True)
        # the decoder stack alone gives the final-normed states the LM head reads
        torch.testing.assert_close(base(input_ids=x).last_hidden_state, out.hidden_states[-1])
        # the routers' first-layers pass: the final norm of the state after layer 1
        with first_layers(m, 1) as b:
            assert b is base and len(decoder_layers(m)) == 1
            torch.testing.assert_close(
                b(input_ids=x, use_cache=False).last_hidden_state, final_norm(m)(out.hidden_states[1])
            )
        assert len(decoder_layers(m)) == 2 and m.config.num_hidden_layers == 2
        torch.testing.assert_close(m(x).logits, out.logits)
    with pytest.raises(MasklabError, match="1..2 layers"):
        with first_layers(m, 3):
            pass


# --------------------------------------------------------------------------- priors
@pytest.mark.parametrize("kind", KINDS)
def test_all_allowed_prior_leaves_logits_unchanged_and_detach_restores_them(kind, folders):
    m = load(str(folders[kind])).model
    impl = m.config._attn_implementation
    x = ids()
    with torch.no_grad():
        ref = m(x).logits
        attach_priors(m, rel)
        assert m.config._attn_implementation == "masklab"
        names = [n for n, _ in m.named_parameters() if "prior" in n]
        assert len(names) == 2 and all("self_attn.prior" in n for n in names)
        torch.testing.assert_close(m(x).logits, ref, atol=1e-5, rtol=1e-5)
        scramble(m)
        assert (m(x).logits - ref).abs().max() > 1e-2  # a non-trivial prior changes the model
        detach_priors(m)
        assert not priors_of(m) and torch.equal(m(x).logits, ref)
    assert m.config._attn_implementation == impl and not any("prior" in n for n, _ in m.named_parameters())
    assert not m.model.layers[0].self_attn._forward_pre_hooks and not m._forward_pre_hooks


def test_gemma2_soft_capping_is_applied_like_eager_attention(folders):
    """Gemma 2 caps its attention logits: SDPA would drop the cap, so load() picks eager and
    masklab's attention applies it (with the cap, the tiny model's outputs change)."""
    lm = load(str(folders["gemma2"]))
    m = lm.model
    assert m.config._attn_implementation == "eager"
    x = ids()
    with torch.no_grad():
        ref = m(x).logits
        m.set_attn_implementation("sdpa")
        uncapped = m(x).logits
        m.set_attn_implementation("eager")
        assert (uncapped - ref).abs().max() > 1e-3
        attach_priors(m, rel)
        torch.testing.assert_close(m(x).logits, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_reach_only_the_priors(kind, folders):
    m = load(str(folders[kind])).model
    m.requires_grad_(False)
    attach_priors(m, rel)
    scramble(m)
    x = ids()
    loss = torch.nn.functional.cross_entropy(m(x).logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))
    loss.backward()
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all("prior" in n for n in trainable)
    for n, p in m.named_parameters():
        if "prior" in n:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None, n


@pytest.mark.parametrize("kind", KINDS)
def test_generate_with_cache_equals_stepwise_forwards_with_a_prior(kind, folders):
    m = load(str(folders[kind])).model
    attach_priors(m, rel)
    scramble(m)
    x = ids(1, 6)
    steps = 8  # 6 + 8 tokens: well past the sliding window of 4
    with torch.no_grad():
        out = m.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        seq = out.sequences
        for t in range(steps):
            full = m(seq[:, : 6 + t]).logits[:, -1]
            torch.testing.assert_close(out.logits[t], full, atol=1e-4, rtol=1e-4)
            assert full.argmax(-1).item() == seq[0, 6 + t].item()


@pytest.mark.parametrize("kind", KINDS)
def test_hide_equals_the_2d_attention_mask(kind, folders):
    m = load(str(folders[kind])).model
    impl = m.config._attn_implementation
    x = ids()
    am = torch.ones_like(x)
    am[:, 3:6] = 0
    am[1, 8] = 0
    keep = am.bool()
    with torch.no_grad():
        ref = m(x, attention_mask=am).logits
        plain = m(x).logits
        with hide(m, keep=keep):
            got = m(x).logits
        assert m.config._attn_implementation == impl  # restored on exit
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        assert (got - plain).abs().max() > 1e-3
        with hide(m, spans=[(3, 6)]):
            spans = m(x[:1]).logits
        torch.testing.assert_close(spans, m(x[:1], attention_mask=am[:1]).logits, atol=1e-5, rtol=1e-5)
        # all heads listed == heads=None; one layer only differs from all layers
        with hide(m, keep=keep, heads=[0, 1, 2, 3]):
            torch.testing.assert_close(m(x).logits, ref, atol=1e-5, rtol=1e-5)
        with hide(m, keep=keep, layers=[1]):
            one = m(x).logits
        assert (one - ref).abs().max() > 1e-3 and (one - plain).abs().max() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_answer_scores_from_a_cached_prefix_equal_the_full_reads(kind, folders):
    """Group testing's key masks read from the first hidden token on, the keys and values
    before it cached: the scores stay those of reading everything (past the window of 4)."""
    from masklab.pretrained.lm import answer_scores, context_cache

    lm = load(str(folders[kind]))
    x, answer = ids(1, 20)[0], ids(1, 3, seed=1)[0]
    keep = torch.ones(5, 20, dtype=torch.bool)
    keep[0, 12:15] = False  # one batch of 3 reads from token 7, one of 2 from token 12
    keep[1, 7:9] = False
    keep[3, 12] = False
    keep[4, 15:] = False
    plain = answer_scores(lm, x, answer, keep, batch=3)
    cached = answer_scores(lm, x, answer, keep, batch=3, prefix=context_cache(lm, x))
    torch.testing.assert_close(cached[0], plain[0], atol=1e-4, rtol=1e-4)
    assert torch.equal(cached[1], plain[1])
    assert plain[0][0] != plain[0][2]  # the hidden tokens matter
    if SLIDES[kind] != [0, 1]:  # a layer reads past the window: another text's cache is read, not ignored
        wrong = answer_scores(lm, x, answer, keep, batch=3, prefix=context_cache(lm, ids(1, 20, seed=2)[0]))
        assert (wrong[0] - plain[0]).abs().max() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_the_generation_cache_and_last_token_attention_reuse_the_context(kind, folders):
    """The answer's generation keeps the context's keys and values (those of one pass over
    it), and the attention labels' pass reads only the last token from them."""
    from transformers import DynamicCache

    from masklab.pretrained.lm import context_cache, generate, last_token_attention
    from masklab.pretrained.models import set_attention

    lm = load(str(folders[kind]))
    x = ids(1, 20)[0]
    cache = DynamicCache()
    new, _ = generate(lm, x, 5, cache=cache)
    assert torch.equal(new, generate(lm, x, 5)[0])
    kept, read = context_cache(lm, x, cache), context_cache(lm, x)
    assert len(kept) == len(read) == 2
    for (k1, v1), (k2, v2) in zip(kept, read):
        assert k1.shape == k2.shape == (1, 2, 20, k1.shape[-1])
        torch.testing.assert_close(k1, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v1, v2, atol=1e-5, rtol=1e-5)
    set_attention(lm, "eager")
    full = last_token_attention(lm, x)
    assert full.shape == (2, 4, 20)
    torch.testing.assert_close(last_token_attention(lm, x, read), full, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- prompts and the CLI
CONTEXT = "Anna lives in Oslo. The sky is blue. Anna moved to Rome in 2020.\n"


def test_chat_template_of_the_folder_is_used_and_raw_overrides(tmp_path):
    from masklab.pretrained.lm import encode, prompt_parts

    folder = save_folder(tmp_path / "chat", "qwen2", chat_template=CHATML)
    lm = load(str(folder))
    assert lm.prompt_format == "chat" and lm.template_chat
    before, after = prompt_parts(lm, "\nQuestion: Where?\nAnswer: Anna is in")
    assert before == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    assert after == "\nQuestion: Where?<|im_end|>\n<|im_start|>assistant\nAnswer: Anna is in"
    enc = encode(lm, ["Anna lives in Oslo."], "\nQuestion: Where?\nAnswer:")
    assert enc.text.startswith(before + "Anna lives") and enc.ids[0].item() == 2  # BOS, then the system turn
    assert load(str(folder), prompt_format="raw").prompt_format == "raw"
    # a Qwen3-style template: thinking is switched off, so the answer follows an empty thinking block
    qwen3 = save_folder(
        tmp_path / "think",
        "qwen3",
        chat_template=CHATML.replace(
            "<|im_start|>assistant\n{% endif %}",
            "<|im_start|>assistant\n{% if enable_thinking is defined and "
            "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}",
        ),
    )
    after = prompt_parts(load(str(qwen3)), "\nQuestion: Q?\nAnswer:")[1]
    assert after == "\nQuestion: Q?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nAnswer:"
    assert prompt_parts(load(str(folder), prompt_format="raw"), "\nQ?") == ("", "\nQ?")


def test_chat_without_template_uses_the_turn_tokens_of_the_vocabulary(folders, tmp_path):
    from masklab.pretrained.lm import prompt_parts

    lm = load(str(folders["qwen2"]), prompt_format="chat")  # no template; ChatML tokens in the vocabulary
    assert not lm.template_chat
    assert prompt_parts(lm, "\nQuestion: Q?\nAnswer: A")[0] == "<|im_start|>user\n"
    assert (
        prompt_parts(lm, "\nQuestion: Q?\nAnswer: A")[1] == "\nQuestion: Q?<|im_end|>\n<|im_start|>assistant\nAnswer: A"
    )
    bare = load(str(save_folder(tmp_path / "bare", "qwen2", chat_tokens=False)), prompt_format="chat")
    with pytest.raises(MasklabError, match="no chat template.*prompt-format raw"):
        prompt_parts(bare, "\nQ?")


@pytest.mark.parametrize("kind", KINDS)
def test_cite_runs_end_to_end_on_the_folder(kind, folders, tmp_path, capsys):
    from masklab.cli import main

    ctx = tmp_path / "context.txt"
    ctx.write_text(CONTEXT)
    rc = main(
        [
            "cite",
            "--model",
            str(folders[kind]),
            "--context",
            str(ctx),
            "--query",
            "Where does Anna live now?",
            "--max-new-tokens",
            "3",
            "--threads",
            "1",
            "--json",
        ]
    )
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["answer"] and len(res["sentences"]) == 3 and res["forward_passes"] > 1


@pytest.mark.parametrize("kind", KINDS)
def test_compress_answers_and_the_router_pass_runs_on_the_folder(kind, folders, tmp_path, capsys):
    from masklab.cli import main
    from masklab.context.routers.features import features
    from masklab.pretrained.models import load

    ctx = tmp_path / "context.txt"
    ctx.write_text(CONTEXT)
    rc = main(
        [
            "compress",
            "--model",
            str(folders[kind]),
            "--context",
            str(ctx),
            "--question",
            "Where does Anna live now?",
            "--router",
            "lexical",
            "--answer",
            "--max-new-tokens",
            "3",
            "--json",
        ]
    )
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and "answer" in res and res["kept"] and res["kept_fraction"] <= 1
    lm = load(str(folders[kind]))
    f = features(
        lm, ["Anna lives in Oslo.", "Bob lives in Rome."], "Where does Anna live?", layers=1, kind="v3-relative"
    )
    assert f.shape[0] == 2 and torch.isfinite(f).all()


# --------------------------------------------------------------------------- bad folders
def test_bad_folders_are_one_clear_error(tmp_path, folders, capsys):
    from masklab.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MasklabError, match="no config.json"):
        load(str(empty))
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(MasklabError, match="'bert' is not supported.*llama.*qwen2.*olmo2"):
        load(str(bert))
    with pytest.raises(MasklabError, match="'bert' is not supported"):
        check_models([str(bert)])  # the studies' early check, before any work
    check_models([str(folders["qwen3"])])
    no_tok = save_folder(tmp_path / "no-tok", "llama")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (no_tok / f).unlink()
    with pytest.raises(MasklabError, match="cannot load a tokenizer"):
        load(str(no_tok))
    cut = save_folder(tmp_path / "cut", "llama")
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(MasklabError, match="do not load"):
        load(str(cut)).model  # noqa: B018  (the weights are read when first asked for)
    no_weights = save_folder(tmp_path / "no-weights", "llama")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(MasklabError, match="do not load"):
        load(str(no_weights)).model  # noqa: B018
    # a checkpoint of the decoder stack alone (no LM head): not a causal LM
    partial = save_folder(tmp_path / "partial", "llama")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(partial / "model.safetensors"))
    save_file(
        {k: v for k, v in tensors.items() if not k.startswith("model.layers.1.")},
        str(partial / "model.safetensors"),
        metadata={"format": "pt"},
    )
    with pytest.raises(MasklabError, match="lack .* tensors"):
        load(str(partial)).model  # noqa: B018
    # the command line prints one line and exits 2
    ctx = tmp_path / "c.txt"
    ctx.write_text(CONTEXT)
    capsys.readouterr()
    assert main(["cite", "--model", str(bert), "--context", str(ctx), "--query", "Where?"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("masklab: error: model type 'bert' is not supported") and "Traceback" not in err
