"""The FlexAttention path of the attention core (``impl="flex"``, and ``"auto"`` on CUDA).

On the CPU, FlexAttention runs eagerly and has no backward: the CPU tests compare its forward
with the math path (every prior and bias kind) and check that a backward falls back to the
math path with one warning. The ``gpu`` tests (skipped, with the reason, where no CUDA GPU is
visible) compare every CUDA path with the math path in float32: FlexAttention forward and
backward for learnable priors, SDPA's fused (memory-efficient) kernel for frozen priors and
masks, the choice ``"auto"`` makes, and bf16 autocast.

Tolerances (float32, stated once): outputs ``Y_TOL`` absolute; gradients ``G_TOL`` relative
to the largest reference gradient entry (at least 1). On the CPU the eager flex forward is the
same arithmetic in another order, so float64 agrees to 1e-10.
"""

import logging

import pytest
import torch

from conftest import needs_gpu
from masklab.priors import attention as attention_module
from masklab.priors.attention import Attention, flex_attention_bias, set_attention_impl

from test_attention_blocked import make_bias, make_prior, run

Y_TOL = 1e-5
G_TOL = 1e-4
PRIORS = ["shared", "per-head", "hard", "distance", "frozen"]
BIASES = ["none", "causal", "causal+padding"]

needs_flex = pytest.mark.skipif(attention_module._FLEX is None, reason="this torch has no FlexAttention")


def twins(prior_kind: str, dim: int, heads: int, T: int, dtype: torch.dtype, impl: str, device: str = "cpu"):
    torch.manual_seed(1)
    ref = Attention(dim, heads, make_prior(prior_kind, heads, T), impl="math").to(device, dtype)
    other = Attention(dim, heads, make_prior(prior_kind, heads, T), impl=impl).to(device, dtype)
    other.load_state_dict(ref.state_dict())
    return ref, other


def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


# ----------------------------------------------------------------------------- CPU


@needs_flex
@pytest.mark.parametrize("bias_kind", BIASES)
@pytest.mark.parametrize("prior_kind", PRIORS)
def test_flex_forward_equals_math_on_cpu(prior_kind, bias_kind):
    ref, flex = twins(prior_kind, 16, 2, 24, torch.float64, "flex")
    torch.manual_seed(2)
    x = torch.randn(3, 24, 16, dtype=torch.float64)
    bias = make_bias(bias_kind, 3, 24)
    with torch.no_grad():
        y0, _ = ref(x, bias)
        y1, _ = flex(x, bias)
    assert torch.allclose(y1, y0, atol=1e-10)


@needs_flex
def test_flex_function_takes_broadcast_and_per_item_terms():
    torch.manual_seed(0)
    B, H, T, dh = 2, 3, 10, 8
    q, k, v = (torch.randn(B, H, T, dh, dtype=torch.float64) for _ in range(3))
    prior = torch.randn(1, T, T, dtype=torch.float64)
    bias = torch.randn(B, 1, T, T, dtype=torch.float64)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=prior[None] + bias)
    assert torch.allclose(flex_attention_bias(q, k, v, prior, bias), want, atol=1e-10)
    assert torch.allclose(
        flex_attention_bias(q, k, v, None, bias),
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias),
        atol=1e-10,
    )


@needs_flex
def test_flex_with_a_backward_on_cpu_falls_back_to_math_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(attention_module, "_warned", set())
    ref, flex = twins("per-head", 16, 2, 12, torch.float64, "flex")
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    grad = torch.randn(2, 12, 16, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="masklab.priors.attention"):
        y0, gx0, gp0 = run(ref, x, None, grad)
        y1, gx1, gp1 = run(flex, x, None, grad)
        assert torch.equal(y1, y0) and torch.equal(gx1, gx0)
        assert all(torch.equal(gp1[n], gp0[n]) for n in gp0)
        run(flex, x, None, grad)
    lines = [r.getMessage() for r in caplog.records if "flex attention unavailable" in r.getMessage()]
    assert len(lines) == 1 and "no backward on the CPU" in lines[0]


def test_auto_on_cpu_never_takes_the_flex_path(monkeypatch):
    calls = []
    monkeypatch.setattr(attention_module, "flex_attention_bias", lambda *a: calls.append(1))
    monkeypatch.setattr(attention_module, "MIN_FAST_SEQ", 8)
    for kind in ("shared", "frozen"):
        attn = Attention(16, 2, make_prior(kind, 2, 8))
        attn(torch.randn(2, 8, 16))
        with torch.no_grad():
            attn(torch.randn(2, 8, 16))
    assert calls == []


def test_flex_is_a_known_impl_and_set_attention_impl_takes_it():
    attn = Attention(16, 2, make_prior("shared", 2, 8))
    set_attention_impl(attn, "flex")
    assert attn.impl == "flex"
    with pytest.raises(ValueError):
        set_attention_impl(attn, "cuda")


def test_cuda_head_dims_flex_cannot_take_are_reported():
    q = torch.empty(1, 1, 4, 12)
    assert attention_module.flex_unavailable(q, needs_grad=False) is None  # CPU forward: any head dim
    assert "no backward on the CPU" in attention_module.flex_unavailable(q, needs_grad=True)


# ----------------------------------------------------------------------------- GPU


# every prior and bias kind at T = 256; T = 40 (not a multiple of FlexAttention's 128-row
# blocks) for one case. Each distinct case is one compile (seconds): the matrix is kept small
# so the gpu tests fit scripts/device_check.py's budget.
GPU_CASES = [(256, p, b) for p in PRIORS for b in BIASES] + [(40, "per-head", "causal+padding")]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("T,prior_kind,bias_kind", GPU_CASES)
def test_gpu_flex_forward_and_backward_equal_math(T, prior_kind, bias_kind, monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 64)  # one compile per case, none falls back to eager
    ref, flex = twins(prior_kind, 64, 4, T, torch.float32, "flex", "cuda")  # head dim 16
    torch.manual_seed(2)
    x = torch.randn(3, T, 64, device="cuda")
    bias = make_bias(bias_kind, 3, T)
    bias = None if bias is None else bias.cuda()
    grad = torch.randn(3, T, 64, device="cuda")
    calls = []
    original = attention_module.flex_attention_bias
    monkeypatch.setattr(attention_module, "flex_attention_bias", lambda *a: calls.append(1) or original(*a))
    y0, gx0, gp0 = run(ref, x, bias, grad)
    y1, gx1, gp1 = run(flex, x, bias, grad)
    assert calls, "the flex path did not run (it fell back to math)"
    assert close(y1, y0, Y_TOL)
    assert close(gx1, gx0, G_TOL)
    assert gp1.keys() == gp0.keys()
    for name in gp0:  # q, k, v, out and the prior's parameters
        assert close(gp1[name], gp0[name], G_TOL), name


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("bias_kind", BIASES)
def test_gpu_frozen_prior_runs_in_sdpa_fused_kernel_and_equals_math(bias_kind):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    T = 256
    ref, auto = twins("frozen", 64, 4, T, torch.float32, "auto", "cuda")
    x = torch.randn(2, T, 64, device="cuda")
    bias = make_bias(bias_kind, 2, T)
    bias = None if bias is None else bias.cuda()
    grad = torch.randn(2, T, 64, device="cuda")
    with sdpa_kernel([SDPBackend.MATH]):
        y0, gx0, gp0 = run(ref, x, bias, grad)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):  # raises if SDPA could not use the fused kernel
        y1, gx1, gp1 = run(auto, x, bias, grad)
    assert close(y1, y0, Y_TOL) and close(gx1, gx0, G_TOL)
    for name in gp0:
        assert close(gp1[name], gp0[name], G_TOL), name


@pytest.mark.gpu
@needs_gpu
def test_gpu_auto_picks_flex_for_a_learnable_prior_at_long_sequences_only(monkeypatch):
    calls = []
    original = attention_module.flex_attention_bias
    monkeypatch.setattr(attention_module, "flex_attention_bias", lambda *a: calls.append(a[0].shape[2]) or original(*a))
    for T in (64, 256):
        attn = Attention(64, 4, make_prior("per-head", 4, T)).cuda()
        y, _ = attn(torch.randn(2, T, 64, device="cuda"))
        y.sum().backward()
    assert calls == [256]
    assert not attention_module._flex_failed


@pytest.mark.gpu
@needs_gpu
def test_gpu_bf16_autocast_runs_flex_and_stays_near_float32():
    from masklab.util import device as devices

    T = 256
    ref, flex = twins("per-head", 64, 4, T, torch.float32, "flex", "cuda")
    x = torch.randn(2, T, 64, device="cuda")
    y0, _ = ref(x)
    with devices.autocast(torch.device("cuda"), "bf16"):
        y1, _ = flex(x)
        y1.float().sum().backward()
    assert y1.dtype == torch.bfloat16
    assert (y1.float() - y0).abs().max().item() < 5e-2  # bf16 keeps 8 bits of mantissa
    assert torch.isfinite(flex.prior.m.grad).all()
