"""The blocked path for learnable priors equals the math path (outputs and q, k, v, prior
gradients), is chosen only where it applies, and falls back with one warning."""

import logging

import pytest
import torch
from torch import nn

from masklab import MaskPrior, causal_bias, key_bias
from masklab.priors import attention as attention_module
from masklab.priors.attention import Attention, BlockedBiasAttention, set_attention_impl


class DistancePrior(nn.Module):
    """Test-local relative prior: one learnable value per head and signed distance ``i - j``."""

    def __init__(self, heads: int, size: int) -> None:
        super().__init__()
        self.size = size
        self.w = nn.Parameter(torch.randn(heads, 2 * size - 1))

    def forward(self, seq: int) -> torch.Tensor:
        i = torch.arange(seq)
        return self.w[:, (i[:, None] - i[None, :]) + self.size - 1]  # (H, seq, seq)


def make_prior(kind: str, heads: int, T: int) -> nn.Module:
    if kind == "distance":
        return DistancePrior(heads, T)
    if kind == "shared":
        return MaskPrior(torch.rand(T, T), mode="learnable")
    if kind == "per-head":
        return MaskPrior(torch.rand(T, T), mode="learnable", heads=heads)
    if kind == "hard":  # learnable, -inf where the structure is 0 (the diagonal is always kept)
        s = (torch.rand(heads, T, T) > 0.4).float()
        s[:, torch.arange(T), torch.arange(T)] = 1.0
        return MaskPrior(s, mode="hard")
    if kind == "frozen":
        return MaskPrior(torch.rand(T, T), mode="frozen")
    raise ValueError(kind)


def make_bias(kind: str, B: int, T: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    causal = causal_bias(T)
    if kind == "causal":
        return causal
    keep = torch.rand(B, T) > 0.3
    keep[:, 0] = True  # with the causal mask every query keeps key 0
    return causal + key_bias(keep)  # (B, 1, T, T)


def run(attn: Attention, x: torch.Tensor, bias: torch.Tensor | None, grad: torch.Tensor):
    x = x.clone().requires_grad_()
    y, _ = attn(x, bias)
    y.backward(grad)
    return y.detach(), x.grad, {n: p.grad for n, p in attn.named_parameters() if p.grad is not None}


def twin(prior_kind: str, dim: int, heads: int, T: int, dtype: torch.dtype) -> tuple[Attention, Attention]:
    torch.manual_seed(1)
    ref = Attention(dim, heads, make_prior(prior_kind, heads, T), impl="math").to(dtype)
    fast = Attention(dim, heads, make_prior(prior_kind, heads, T), impl="blocked").to(dtype)
    fast.load_state_dict(ref.state_dict())
    return ref, fast


@pytest.mark.parametrize("block_bytes", [attention_module.BLOCK_BYTES, 1024])  # 1024: bands of 16 query rows
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("bias_kind", ["none", "causal", "causal+padding"])
@pytest.mark.parametrize("prior_kind", ["shared", "per-head", "hard", "distance", "frozen"])
def test_blocked_path_equals_math_path(prior_kind, bias_kind, B, block_bytes, monkeypatch):
    monkeypatch.setattr(attention_module, "BLOCK_BYTES", block_bytes)
    dim, heads, T = 16, 2, 40
    ref, fast = twin(prior_kind, dim, heads, T, torch.float64)
    torch.manual_seed(2)
    x = torch.randn(B, T, dim, dtype=torch.float64)
    bias = make_bias(bias_kind, B, T)
    grad = torch.randn(B, T, dim, dtype=torch.float64)
    y0, gx0, gp0 = run(ref, x, bias, grad)
    y1, gx1, gp1 = run(fast, x, bias, grad)
    assert torch.allclose(y1, y0, atol=1e-10)
    assert torch.allclose(gx1, gx0, atol=1e-10)  # through q, k and v
    assert gp1.keys() == gp0.keys()
    for name in gp0:  # q, k, v, out weights and the prior's parameters
        assert torch.allclose(gp1[name], gp0[name], atol=1e-10), name
    assert ("prior.m" in gp0 or "prior.w" in gp0) == (prior_kind != "frozen")


def test_float32_agrees_to_float_tolerance():
    ref, fast = twin("per-head", 64, 4, 96, torch.float32)
    x = torch.randn(5, 96, 64)
    bias = make_bias("causal+padding", 5, 96)
    grad = torch.randn(5, 96, 64)
    y0, gx0, gp0 = run(ref, x, bias, grad)
    y1, gx1, gp1 = run(fast, x, bias, grad)
    assert (y1 - y0).abs().max() < 1e-5
    assert (gx1 - gx0).abs().max() < 1e-4
    for name in gp0:
        assert (gp1[name] - gp0[name]).abs().max() < 1e-4 * max(1.0, gp0[name].abs().max().item()), name


def test_distance_prior_gradient_is_summed_along_diagonals():
    ref, fast = twin("distance", 16, 2, 24, torch.float64)
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    y, _ = fast(x)
    y.sum().backward()
    g = fast.prior.w.grad  # (H, 2T - 1): every distance, including the +-(T-1) corners, gets a gradient
    assert g.shape == (2, 47) and (g != 0).all()


def test_auto_uses_blocked_only_for_a_prior_that_requires_grad(monkeypatch):
    calls = []
    original = BlockedBiasAttention.apply
    monkeypatch.setattr(BlockedBiasAttention, "apply", lambda *a: calls.append(1) or original(*a))
    x = torch.randn(2, 8, 16)
    learnable = Attention(16, 2, MaskPrior(torch.rand(8, 8)))
    assert learnable.impl == "auto"
    learnable(x)  # T = 8 < MIN_FAST_SEQ: the math path
    assert len(calls) == 0
    monkeypatch.setattr(attention_module, "MIN_FAST_SEQ", 8)
    learnable(x)
    assert len(calls) == 1
    learnable(x, return_attn=True)  # eager path keeps returning probabilities
    with torch.no_grad():
        learnable(x)
    Attention(16, 2, MaskPrior(torch.rand(8, 8), mode="frozen"))(x)
    Attention(16, 2)(x)
    set_attention_impl(learnable, "math")
    learnable(x)
    assert len(calls) == 1


def test_unavailable_blocked_path_falls_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(attention_module, "_FLASH_CPU", None)
    monkeypatch.setattr(attention_module, "_warned", set())
    ref, fast = twin("shared", 16, 2, 8, torch.float32)
    x = torch.randn(2, 8, 16)
    with caplog.at_level(logging.WARNING, logger="masklab.priors.attention"):
        y1, _ = fast(x)
        fast(x)
    assert torch.equal(y1, ref(x)[0])
    lines = [r for r in caplog.records if "blocked attention unavailable" in r.getMessage()]
    assert len(lines) == 1


def test_unknown_impl_is_rejected():
    with pytest.raises(ValueError):
        Attention(16, 2, impl="fast")
