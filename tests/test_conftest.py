"""The shared-model guard of tests/conftest.py: a test that leaves a session model changed
fails and the copy is dropped; switching attention back and forth, or nothing, passes.
(A tiny Llama stands for the packaged model.)"""

import pytest
import torch

pytest.importorskip("transformers")

from conftest import _Session, _state, tiny_model  # noqa: E402
from masklab.priors.bias import RelativePrior  # noqa: E402
from masklab.pretrained.hf import attach_priors  # noqa: E402
from masklab.pretrained.models import LoadedModel  # noqa: E402


def session() -> tuple[_Session, LoadedModel]:
    lm = LoadedModel("tiny", tiny_model("llama"), None, "cache", 0.0, "raw")
    s = _Session()
    s.loaded["tiny"] = (lm, _state(lm), lm.prompt_format)
    return s, lm


def test_an_untouched_model_or_a_switched_attention_passes():
    s, lm = session()
    s.check()
    lm.model.set_attn_implementation("eager")
    s.check()
    assert "tiny" in s.loaded and lm.model.config._attn_implementation == "sdpa"  # switched back


@pytest.mark.parametrize("change", ["prior", "weight", "train", "grad", "hook", "prompt"])
def test_a_changed_model_fails_the_test_and_is_dropped(change):
    s, lm = session()
    m = lm.model
    if change == "prior":
        attach_priors(m, lambda i, h: RelativePrior(h, max_distance=16))
    elif change == "weight":
        with torch.no_grad():
            next(m.parameters())[0, 0] += 1
    elif change == "train":
        m.train()
    elif change == "grad":
        m.requires_grad_(False)
    elif change == "hook":
        m.model.layers[0].register_forward_hook(lambda *a: None)
    else:
        lm.prompt_format = "chat"
    with pytest.raises(pytest.fail.Exception, match="changed the shared tiny"):
        s.check()
    assert "tiny" not in s.loaded
