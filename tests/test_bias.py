"""MaskPrior: init, modes, and the paper's gradient bound (Theorem 1 / Corollary 1)."""

import torch
import torch.nn.functional as F

import pytest

from masklab import Attention, MaskPrior


def test_init_from_structure_and_strengths():
    s = torch.tensor([[1.0, 0.0], [0.5, 1.0]])
    prior = MaskPrior(s, allowed=4.0, suppressed=8.0)
    assert torch.allclose(prior.m[0], torch.tensor([[4.0, -8.0], [-2.0, 4.0]]))
    bias = prior()
    assert bias.shape == (1, 2, 2)
    assert (bias <= 0).all()  # logsigmoid can only suppress
    assert torch.allclose(bias, F.logsigmoid(prior.m))


def test_per_head_structure_and_cropping():
    prior = MaskPrior(torch.rand(3, 5, 5))
    assert prior().shape == (3, 5, 5)
    assert MaskPrior(torch.rand(5, 5))().shape == (1, 5, 5)  # shared by all heads
    own = MaskPrior(torch.eye(5), heads=4)  # one learnable copy per head
    assert own().shape == (4, 5, 5) and own.m.shape == (4, 5, 5)
    assert prior(4).shape == (3, 4, 4)
    with pytest.raises(ValueError):
        prior(6)


def test_modes():
    s = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert MaskPrior(s, mode="learnable").m.requires_grad
    assert not MaskPrior(s, mode="frozen").m.requires_grad
    hard = MaskPrior(s, mode="hard")()
    assert torch.isinf(hard[0, 0, 1]) and hard[0, 0, 0] > -0.01
    with pytest.raises(ValueError):
        MaskPrior(s, mode="soft")
    with pytest.raises(ValueError):
        MaskPrior(torch.full((2, 2), 2.0))


def test_drift_measures_change_of_the_bias():
    prior = MaskPrior(torch.eye(3))
    assert prior.drift() == 0
    with torch.no_grad():
        prior.m.add_(1.0)
    assert prior.drift() > 0


def test_gradient_bound_on_mask_entries():
    """Theorem 1 setting: one query, loss L = <delta, y> with ||delta|| = 1 and values in a ball
    of radius 1/2, so |dL/dz_j| <= p_j. Then |dL/dm_j| <= p_j * sigmoid(-m_j), whatever the
    feature scale; a raw additive bias M (without logsigmoid) would break it."""
    torch.manual_seed(0)
    worst = 0.0
    for scale in (1.0, 10.0, 100.0):
        for _ in range(20):
            T, d = 8, 16
            m = (torch.randn(T) * 6).requires_grad_(True)
            q, k = torch.randn(d) * scale, torch.randn(T, d) * scale
            v = torch.randn(T, d)
            v = 0.5 * v / v.norm(dim=1, keepdim=True)
            delta = torch.randn(d)
            delta = delta / delta.norm()
            p = (k @ q / d**0.5 + F.logsigmoid(m)).softmax(-1)
            (p @ v @ delta).backward()
            bound = p.detach() * torch.sigmoid(-m.detach())
            assert (m.grad.abs() <= bound + 1e-7).all()
            worst = max(worst, (m.grad.abs() / bound.clamp_min(1e-12)).max().item())
    assert worst > 0.3  # the bound is not vacuous: some entries come close to it

    # control: a raw bias on the logits has gradient p_j * (...) without the sigmoid(-m) factor
    m = torch.full((8,), 8.0, requires_grad=True)
    k, v = torch.randn(8, 16), torch.randn(8, 16)
    v = 0.5 * v / v.norm(dim=1, keepdim=True)
    p = (k @ torch.randn(16) + m).softmax(-1)
    (p @ v @ (torch.ones(16) / 4)).backward()
    assert (m.grad.abs() > p.detach() * torch.sigmoid(-m.detach())).any()


def test_qk_gradient_grows_with_feature_scale_mask_gradient_does_not():
    torch.manual_seed(1)
    grads = []
    for scale in (1.0, 30.0):
        prior = MaskPrior(torch.rand(6, 6))
        attn = Attention(16, 1, prior)
        x = torch.randn(4, 6, 16) * scale
        y, _ = attn(x)
        y.square().mean().backward()
        grads.append((attn.q.weight.grad.norm().item(), prior.m.grad.abs().max().item()))
    (q1, m1), (q2, m2) = grads
    assert q2 > 10 * q1
    # mask entries stay bounded by p * sigmoid(-m) <= 1 times the output-gradient scale
    assert m2 / m1 < q2 / q1
