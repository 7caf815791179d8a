"""MaskPrior: init, modes, and the paper's gradient bound (Theorem 1 / Corollary 1)."""

import torch
import torch.nn.functional as F
from torch import nn

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


class RawBias(nn.Module):
    """Wrong prior for the controls below: ``M`` added to the logits as is (no logsigmoid)."""

    def __init__(self, structure: torch.Tensor) -> None:
        super().__init__()
        self.m = nn.Parameter(MaskPrior(structure).m.detach().clone())

    def forward(self, seq: int) -> torch.Tensor:
        return self.m[:, :seq, :seq]


class ZeroBias(nn.Module):
    """Wrong prior for the controls below: a plain zero bias; ``M`` exists but is never used."""

    def __init__(self, structure: torch.Tensor, mode: str = "learnable") -> None:
        super().__init__()
        self.m = nn.Parameter(MaskPrior(structure).m.detach().clone(), requires_grad=mode != "frozen")

    def forward(self, seq: int) -> torch.Tensor:
        return torch.zeros(1, seq, seq)


def bound_ratios(make_prior, scales=(1.0, 10.0, 100.0), trials=10, T=8, d=16) -> torch.Tensor:
    """Theorem 1 through the real attention layer: one head, W_V = W_O = I (no biases), token
    values in a ball of radius 1/2, loss ``L = sum_i <delta_i, y_i>`` with unit ``delta_i``, so
    ``|dL/dz_ij| <= p_ij`` for the logits z. For a MaskPrior the gradient on its ``M`` must obey
    ``|dL/dM_ij| <= p_ij sigmoid(-M_ij)`` whatever the feature scale (W_Q, W_K scaled up).
    Returns ``|dL/dM| / bound`` over every entry, trial and scale."""
    torch.manual_seed(0)
    ratios = []
    for scale in scales:
        for _ in range(trials):
            prior = make_prior(torch.rand(T, T))
            attn = Attention(d, 1, prior)
            with torch.no_grad():
                for lin in (attn.v, attn.out):
                    lin.weight.copy_(torch.eye(d))
                    lin.bias.zero_()
                attn.q.weight.mul_(scale)
                attn.k.weight.mul_(scale)
            x = torch.randn(1, T, d)
            x = 0.5 * x / x.norm(dim=-1, keepdim=True)
            delta = torch.randn(1, T, d)
            delta = delta / delta.norm(dim=-1, keepdim=True)
            y, _ = attn(x)  # the training path (SDPA with the prior's mask)
            (y * delta).sum().backward()
            assert prior.m.grad is not None, "the prior's M got no gradient"
            with torch.no_grad():
                _, p = attn(x, return_attn=True)  # (1, 1, T, T)
            bound = p[0] * torch.sigmoid(-prior.m.detach())  # (1, T, T)
            ratios.append((prior.m.grad.abs() / bound.clamp_min(1e-12)).flatten())
    return torch.cat(ratios)


def test_gradient_bound_on_mask_entries():
    """The paper's gradient bound, on MaskPrior's own forward inside Attention: every entry
    obeys it, and some come close (the bound is not vacuous)."""
    r = bound_ratios(MaskPrior)
    assert r.max() <= 1 + 1e-4
    assert r.max() > 0.3


def test_gradient_bound_fails_for_the_wrong_priors():
    """The check above fails for a raw bias (no logsigmoid) and for a zero bias (no gradient)."""
    assert bound_ratios(RawBias).max() > 1.5
    with pytest.raises(AssertionError, match="got no gradient"):
        bound_ratios(ZeroBias)


def locality_task(make_prior, mode: str, steps: int = 30):
    """Train a one-head attention layer with a diagonal-structure prior to copy the token at
    the previous position (which the structure suppresses); return the prior and the
    attention mass on the diagonal of a fresh layer with the same prior, before training."""
    torch.manual_seed(0)
    T, d = 6, 8
    prior = make_prior(torch.eye(T), mode=mode)
    attn = Attention(d, 1, prior)
    x = torch.randn(64, T, d)
    with torch.no_grad():
        _, p = attn(x, return_attn=True)
    diag_mass = p[0, 0].diagonal().mean().item()
    target = torch.roll(x, 1, dims=1)
    opt = torch.optim.Adam([q for q in attn.parameters() if q.requires_grad], lr=0.05)
    for _ in range(steps):
        loss = (attn(x)[0] - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return prior, diag_mass


def moves_and_shapes(make_prior) -> tuple[bool, bool, bool]:
    """(learnable M moved under training, frozen M did not, frozen prior concentrates the
    attention on its allowed keys: mass on the diagonal well above uniform 1/T)."""
    learnable, _ = locality_task(make_prior, "learnable")
    frozen, diag_mass = locality_task(make_prior, "frozen")
    moved = (learnable.m.detach() - MaskPrior(torch.eye(6)).m0).abs().max().item() > 0.1
    stayed = torch.equal(frozen.m.detach(), MaskPrior(torch.eye(6)).m0)
    return moved, stayed, diag_mass > 0.9


def test_learnable_prior_moves_frozen_prior_stays_and_still_shapes_attention():
    assert moves_and_shapes(MaskPrior) == (True, True, True)
    # a plain zero bias in its place: M never moves and attention is not shaped
    moved, stayed, shaped = moves_and_shapes(ZeroBias)
    assert not moved and not shaped


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
