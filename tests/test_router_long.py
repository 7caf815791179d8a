"""The trained routers' first-layers pass on long inputs (:func:`masklab.pretrained.arch.first_layers`
runs :func:`~masklab.pretrained.arch.causal_attention`): the same attention as transformers'
own, without its ``(T, T)`` masks; the same router scores; a bar over several windows.

Tiny random models of tests/conftest.py (a sliding window of 4 tokens on Gemma 3's
first layer, character tokens), so inputs of a few hundred tokens are long for them."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from conftest import save_tiny_folder as save_folder  # noqa: E402
from masklab.text.document import Document  # noqa: E402
from masklab.context.routers.trained import EvidenceRouter  # noqa: E402
from masklab.context.routers.features import FEATURE_SETS, LinearRouter  # noqa: E402
from masklab.util.errors import MasklabError  # noqa: E402
from masklab.pretrained import arch  # noqa: E402
from masklab.pretrained.models import load, set_attention  # noqa: E402

torch.set_num_threads(1)
UNITS = [
    f"The {w} key is in room {i * 7 % 13}." for i, w in enumerate(["red", "blue", "old", "spare", "brass", "iron"])
]
QUESTION = "Where is the brass key kept?"


def reference_attention(q, k, v, window, scale):
    """Explicit softmax attention: key ``j`` visible to query ``i`` when ``j <= i`` (and
    ``i - j < window``)."""
    T = q.shape[-2]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    visible = (j <= i) & ((i - j < window) if window else True)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    logits = (q @ k.transpose(-2, -1)) * scale
    return (logits.masked_fill(~visible, float("-inf")).softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("T,window", [(37, 8), (40, 8), (8, 8), (5, 8), (23, None), (30, 1)])
def test_causal_attention_is_softmax_attention_within_the_window(T, window):
    g = torch.Generator().manual_seed(T)
    q = torch.randn(2, 4, T, 16, generator=g)
    k, v = torch.randn(2, 2, T, 16, generator=g), torch.randn(2, 2, T, 16, generator=g)  # grouped KV heads
    out, probs = arch.causal_attention(None, q, k, v, None, scaling=0.3, sliding_window=window)
    assert probs is None and out.shape == (2, T, 4, 16)
    torch.testing.assert_close(out, reference_attention(q, k, v, window, 0.3), atol=1e-5, rtol=1e-5)


def test_causal_attention_refuses_masks_and_caches():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(MasklabError, match="unpadded"):
        arch.causal_attention(None, q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.bool))
    with pytest.raises(MasklabError, match="cache"):
        arch.causal_attention(None, q, torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), None)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("long")
    return {k: load(str(save_folder(root / k, k))) for k in ("llama", "gemma3_text")}


def router(lm, kind: str, layers: int, progress: bool = False) -> EvidenceRouter:
    n = 16 if kind == "v4-hop" else 15
    g = torch.Generator().manual_seed(layers)
    r = LinearRouter(torch.randn(n, generator=g), torch.zeros(1), torch.randn(n, generator=g) * 0.1, torch.ones(n))
    return EvidenceRouter(
        lm, routers={"evidence": r}, meta={"model": lm.name, "features": kind, "layers": layers}, progress=progress
    )


@pytest.mark.parametrize("kind", ["llama", "gemma3_text"])
@pytest.mark.parametrize("features", ["v3-relative", "v4-hop"])
@pytest.mark.parametrize("layers", [1, 2])
def test_scores_equal_the_transformers_attention_path(models, kind, features, layers, monkeypatch):
    """One window (about 200 tokens, far past Gemma's 4-token sliding window): the fast
    pass scores as transformers' sdpa path (the code before it) and its eager path do."""
    assert features in FEATURE_SETS
    lm = models[kind]
    doc = Document(units=UNITS)
    r = router(lm, features, layers)
    calls = []
    real = arch.causal_attention
    # the registry's own entry: a library that wrapped the registered functions when it was
    # imported (kvpress, by an earlier test) holds a copy that arch.causal_attention no longer names
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    monkeypatch.setitem(
        ALL_ATTENTION_FUNCTIONS,
        arch.LONG_ATTN,
        lambda *a, **kw: calls.append(kw.get("sliding_window")) or real(*a, **kw),
    )
    read = r.read(doc, [QUESTION])
    fast = read.values[0]
    assert read.windows == 1 and len(calls) == layers  # the fast function ran in every layer read
    if kind == "gemma3_text":
        assert calls[0] == 4  # Gemma's first layer slides
    monkeypatch.setattr(arch, "_fast_pass", lambda model: False)
    sdpa = r.score(doc, QUESTION)
    set_attention(lm, "eager")
    try:
        eager = r.score(doc, QUESTION)
    finally:
        set_attention(lm, "sdpa")
    assert len(calls) == layers  # neither reference used it
    torch.testing.assert_close(fast, sdpa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast, eager, atol=1e-4, rtol=1e-4)  # eager sums in another order
    assert torch.equal(torch.argsort(fast, descending=True), torch.argsort(sdpa, descending=True))
    assert lm.model.config._attn_implementation == "sdpa"  # restored after each pass


def test_a_bar_counts_the_windows_of_a_long_document_only_with_progress(models, capsys):
    lm = models["llama"]  # 256 positions: the 6 units x 4 (about 700 characters, one token each) take 3 windows
    doc = Document(units=UNITS * 4)
    quiet = router(lm, "v3-relative", 1).score(doc, QUESTION)
    assert "window" not in capsys.readouterr().err
    r = router(lm, "v3-relative", 1, progress=True)
    read = r.read(doc, [QUESTION])
    loud, n = read.values[0], read.windows
    err = capsys.readouterr().err
    assert n > 2 and f"{n}/{n}" in err and "window" in err
    assert torch.equal(quiet, loud)
    r.score(Document(units=UNITS[:3]), QUESTION)  # one window: no bar
    assert capsys.readouterr().err == ""
