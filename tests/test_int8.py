"""``--int8``: the encoders' linear layers in int8 through oneDNN, without PyTorch's deprecated quantized
tensors (no warning), close to float."""

import warnings

import torch

from conftest import needs_dense
from masklab.context.embedder import Int8Linear, int8_linears


def test_an_int8_linear_is_close_to_float_and_warns_nothing():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.GELU(), torch.nn.Linear(96, 16, bias=False)).eval()
    x = torch.randn(3, 7, 48) * 2 + 0.5  # an offset input: the zero point matters
    with torch.no_grad():
        want = model(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = int8_linears(model)(x)
    assert [type(m) for m in model] == [Int8Linear, torch.nn.GELU, Int8Linear]
    assert got.shape == want.shape and got.dtype == torch.float32
    err = (got - want).abs().max() / want.abs().max()
    assert 0 < err < 0.03, err  # rounded (not the float layer itself), and within a few per cent


def test_an_int8_linear_rounds_each_output_channel_on_its_own_scale():
    lin = torch.nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, -0.5, 0.25, 0.0], [100.0, 50.0, -25.0, 0.0]]))
    q = Int8Linear(lin)
    assert torch.allclose(q.weight_scale, torch.tensor([1.0, 100.0]) / 127)
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    with torch.no_grad():
        assert torch.allclose(q(x), lin(x), rtol=0.02)  # the small channel is not rounded to 0 by the large one's scale


@needs_dense
def test_the_int8_pruner_warns_nothing_and_ranks_like_float():
    from masklab.context.routers import load_router
    from masklab.text.document import Document

    doc = Document(
        units=[
            "The library opens at nine in the morning.",
            "The budget was approved by Daniel Reyes, the board president.",
            "The roof above the periodicals room leaks.",
            "Summer opening hours stay as they are.",
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        int8 = load_router("pruner-ctx", int8=True)
        got = int8.score(doc, "Who approved the budget?")
    want = load_router("pruner-ctx").score(doc, "Who approved the budget?")
    encoder = int8.pruner.embedder.model
    assert not any(type(m) is torch.nn.Linear for m in encoder.modules())
    assert int(got.argmax()) == int(want.argmax()) == 1
    assert float((got - want).abs().max()) < 0.15  # keep probabilities: val MRR is measured in ctx_speed.py
