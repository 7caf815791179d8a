"""Language modelling: corpora (pydoc embedded, WikiText-2 / TinyStories files), tokenisers,
the three priors, and the CLI end to end (--quick)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from masklab.priors.bias import ALiBi
from masklab.lab.runner import MasklabError
from masklab.priors.structures import relative_distance
from masklab.lab.studies.lm import build_model
from masklab.lab.tasks.text import load_corpus, tokenize


def test_pydoc_corpus_is_english_text():
    c = load_corpus("pydoc")
    assert len(c.train) > 300_000 and len(c.valid) > 30_000
    assert " the " in c.train and "statement" in c.train
    tok = tokenize(c, "byte")
    assert tok.vocab == 256 and bytes(tok.train[:50].tolist()).decode() == c.train[:50]


def test_wikitext_and_tinystories_files(tmp_path):
    (tmp_path / "wiki.train.raw").write_text(" = Valkyria = \n Senjō no Valkyria 3 is a game .\n")
    (tmp_path / "wiki.valid.raw").write_text(" = Homarus = \n Homarus is a genus .\n")
    c = load_corpus("wikitext2", tmp_path)
    assert "Senjō" in c.train and "Homarus" in c.valid
    assert len(tokenize(c).train) == len(c.train.encode("utf-8"))  # bytes, not characters
    ts = tmp_path / "ts"
    ts.mkdir()
    (ts / "TinyStoriesV2-GPT4-train.txt").write_text("Once upon a time there was a cat.<|endoftext|>" * 3)
    (ts / "TinyStoriesV2-GPT4-valid.txt").write_text("Once upon a time a dog ran.")
    c = load_corpus("tinystories", ts, max_chars=20)
    assert c.train == "Once upon a time the"


def test_corpus_errors(tmp_path):
    with pytest.raises(MasklabError, match="needs --data-dir"):
        load_corpus("wikitext2")
    with pytest.raises(MasklabError, match="wiki.valid.raw"):
        (tmp_path / "wiki.train.raw").write_text("x")
        load_corpus("wikitext2", tmp_path)
    (tmp_path / "wiki.valid.raw").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(MasklabError, match="not UTF-8"):
        load_corpus("wikitext2", tmp_path)


def test_bpe_tokenizer():
    pytest.importorskip("tokenizers")
    c = load_corpus("pydoc")
    c.train, c.valid = c.train[:60_000], c.valid[:5_000]
    tok = tokenize(c, "bpe", 400)
    assert tok.vocab <= 400 and len(tok.train) < 0.7 * len(c.train.encode())  # merges compress
    assert int(tok.train.max()) < tok.vocab


def test_relative_distance_structure():
    s = relative_distance(6, 3)
    assert s.shape == (3, 6, 6)
    assert (s.triu(1) == 0).all() and (s.diagonal(dim1=-2, dim2=-1) == 1).all()
    assert (s[:, 5, :5].diff(dim=-1) > 0).all()  # decreasing with distance (earlier keys lower)
    assert s[0, 5, 0] < s[2, 5, 0]  # head widths grow


def test_alibi_bias():
    b = ALiBi(4)(5)
    assert b.shape == (4, 5, 5) and (b.diagonal(dim1=-2, dim2=-1) == 0).all()
    assert b[0, 4, 0] == pytest.approx(-4 * 2**-2) and b[3, 4, 0] == pytest.approx(-4 * 2**-8)


@pytest.mark.parametrize("method", ["vanilla", "alibi", "mask", "mask-nopos", "mask-zero"])
def test_priors_build_and_stay_causal(method):
    p = {"method": method, "block": 16, "dim": 32, "depth": 2, "heads": 4, "allowed": 6.0, "suppressed": 6.0}
    torch.manual_seed(0)
    model = build_model(p, 256)
    assert (model.pos is None) == (method in ("alibi", "mask-nopos"))
    x = torch.randint(256, (2, 16))
    logits, attn = model(x, return_attn=True)
    assert logits.shape == (2, 16, 256)
    assert all(a.triu(1).abs().max() == 0 for a in attn)  # no query reads the future
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 256  # changing the future leaves the past's logits alone
    assert torch.allclose(model(y)[0][:, :10], logits[:, :10], atol=1e-5)


def test_mask_prior_prefers_recent_tokens_at_step0():
    p = {"method": "mask", "block": 32, "dim": 32, "depth": 1, "heads": 4, "allowed": 6.0, "suppressed": 6.0}
    model = build_model(p, 256)
    _, attn = model(torch.randint(256, (4, 32)), return_attn=True)
    a = attn[0][:, 0, 31]  # short-range head, last query: (B, T)
    assert a[:, 28:].sum(-1).min() > 0.9


@pytest.mark.slow
def test_lm_quick_cli(tmp_path):
    out = tmp_path / "lm"
    proc = subprocess.run(
        [sys.executable, "-m", "masklab", "lm", "--quick", "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    assert {r["method"] for r in res["runs"]} == {"vanilla", "alibi", "mask"}
    for r in res["runs"]:
        ppl = r["curves"]["val_ppl"]
        assert ppl[-1] < 0.2 * ppl[0]  # learns: from ~256 (uniform bytes) down
        assert r["metrics"]["steps_to_target"] is None or r["metrics"]["steps_to_target"] in r["curves"]["step"]
    assert (out / "lm_val_ppl.png").stat().st_size > 1000
