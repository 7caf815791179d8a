"""QK-side baselines reproduce the mask prior's pattern at step 0 (else the comparison is void)."""

import pytest
import torch

from masklab.priors.bias import MaskPrior
from masklab.models import GPT, TokenEncoder
from masklab.priors.qk_init import QK_INITS
from masklab.priors.structures import allowed_mass
from masklab.priors.structures import design_structure


def _inputs(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (256, n), generator=g)


@pytest.mark.parametrize("name", ["qk-svd", "qk-opt"])
@pytest.mark.parametrize("design", ["support-block", "pairwise"])
def test_qk_init_matches_the_mask_pattern_at_step_0(name, design):
    torch.manual_seed(0)
    structs = [design_structure(design, [(0, 1)], 15, layer, 2, 4) for layer in range(2)]
    masked = TokenEncoder(2, 15, 64, 2, 4, priors=[MaskPrior(s) for s in structs])
    vanilla = TokenEncoder(2, 15, 64, 2, 4)
    model = TokenEncoder(2, 15, 64, 2, 4)
    QK_INITS[name].apply(model, _inputs(15, 1), structs)
    held_out = _inputs(15, 2)  # not the inputs the init was fitted on

    def mass(m):
        _, attn = m(held_out, return_attn=True)
        return sum(allowed_mass(p, s, "all") for p, s in zip(attn, structs)) / len(structs)

    target, got, base = mass(masked), mass(model), mass(vanilla)
    assert base < 0.2 < 0.9 < target
    assert got > 0.7, f"{name} reaches only {got:.2f} of the allowed mass (mask: {target:.2f})"


def test_vanilla_changes_nothing():
    torch.manual_seed(0)
    m = TokenEncoder(2, 5, 16, 1, 2)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    QK_INITS["vanilla"].apply(m, _inputs(5, 0), [torch.eye(6)])
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_qk_init_works_on_the_causal_decoder():
    torch.manual_seed(0)
    T = 12
    local = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs() <= 1
    structs = [local.float()[None]]
    model = GPT(10, T, 32, 1, 2)
    tokens = torch.randint(0, 10, (128, T))
    QK_INITS["qk-opt"].apply(model, tokens, structs)
    _, attn = model(torch.randint(0, 10, (64, T)), return_attn=True)
    assert allowed_mass(attn[0], structs[0], "all") > 0.8
