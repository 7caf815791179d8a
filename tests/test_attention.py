"""The one attention core: fused and eager paths agree; bias terms act as specified."""

import math

import pytest
import torch
import torch.nn.functional as F

from masklab import Attention, Block, MaskPrior, causal_bias, key_bias


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_fused_and_eager_paths_agree_with_every_bias_term():
    prior = MaskPrior(torch.rand(4, 12, 12), mode="learnable")
    attn = Attention(32, 4, prior)
    x = torch.randn(3, 12, 32)
    keep = torch.rand(3, 12) > 0.3
    keep[:, :1] = True
    bias = causal_bias(12) + key_bias(keep)
    bias = bias.masked_fill(torch.eye(12, dtype=torch.bool), 0.0)  # every query keeps itself
    fused, none = attn(x, bias)
    eager, probs = attn(x, bias, return_attn=True)
    assert none is None
    assert (fused - eager).abs().max().item() <= 1e-5
    assert probs.shape == (3, 4, 12, 12)
    assert torch.allclose(probs.sum(-1), torch.ones(3, 4, 12))


def test_eager_probabilities_are_softmax_of_qk_plus_bias():
    attn = Attention(16, 2)
    x = torch.randn(1, 5, 16)
    bias = torch.randn(1, 2, 5, 5)
    _, probs = attn(x, bias, return_attn=True)
    q = attn.q(x).view(1, 5, 2, 8).transpose(1, 2)
    k = attn.k(x).view(1, 5, 2, 8).transpose(1, 2)
    want = (q @ k.transpose(-2, -1) / math.sqrt(8) + bias).softmax(-1)
    assert torch.allclose(probs, want, atol=1e-6)


def test_hidden_keys_get_zero_probability_and_do_not_change_output():
    attn = Attention(16, 2)
    x = torch.randn(2, 6, 16)
    keep = torch.tensor([[1, 1, 0, 1, 0, 1]] * 2, dtype=torch.bool)
    y, probs = attn(x, key_bias(keep), return_attn=True)
    assert probs[..., ~keep[0]].abs().max() == 0
    # changing a hidden token's content changes nothing for the visible queries' outputs
    x2 = x.clone()
    x2[:, 2] = torch.randn(16)
    y2, _ = attn(x2, key_bias(keep))
    assert torch.allclose(y[:, keep[0]], y2[:, keep[0]], atol=1e-6)


def test_causal_bias_blocks_the_future():
    b = causal_bias(4)
    assert torch.isinf(b[0, 1]) and b[1, 0] == 0 and b[2, 2] == 0


def test_block_is_pre_layernorm_residual():
    block = Block(16, 4)
    x = torch.randn(2, 5, 16)
    y, probs = block(x, return_attn=True)
    a, _ = block.attn(block.ln1(x))
    h = x + a
    assert torch.allclose(y, h + block.mlp(block.ln2(h)), atol=1e-6)
    assert probs.shape == (2, 4, 5, 5)


def test_key_bias_rejects_non_bool():
    with pytest.raises(TypeError):
        key_bias(torch.ones(2, 3))


def test_sdpa_is_the_fused_path():
    # the fused path is torch's SDPA with the summed bias, nothing else
    prior = MaskPrior(torch.eye(6))
    attn = Attention(12, 3, prior)
    x = torch.randn(2, 6, 12)
    q = attn.q(x).view(2, 6, 3, 4).transpose(1, 2)
    k = attn.k(x).view(2, 6, 3, 4).transpose(1, 2)
    v = attn.v(x).view(2, 6, 3, 4).transpose(1, 2)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=prior(6))
    want = attn.out(want.transpose(1, 2).reshape(2, 6, 12))
    assert torch.allclose(attn(x)[0], want, atol=1e-6)


def test_query_scale_is_a_per_example_inverse_temperature():
    torch.manual_seed(0)
    attn = Attention(16, 2)
    x = torch.randn(2, 5, 16)
    _, p1 = attn(x, return_attn=True)
    scale = torch.tensor([1.0, 3.0])
    y, p = attn(x, return_attn=True, query_scale=scale)
    assert torch.allclose(p[0], p1[0], atol=1e-6)
    q = attn.q(x[1]).view(5, 2, 8).transpose(0, 1)
    k = attn.k(x[1]).view(5, 2, 8).transpose(0, 1)
    assert torch.allclose(p[1], (3.0 * q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(-1), atol=1e-5)
    fused, _ = attn(x, query_scale=scale)
    assert torch.allclose(fused, y, atol=1e-5)  # both paths honour it
