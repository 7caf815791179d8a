"""masklab: structure in transformer attention.

One attention core (:class:`Attention`, :class:`Block`) whose logits are a sum of
additive bias terms: learnable mask priors (:class:`MaskPrior`, ``logsigmoid(M)``;
:class:`RelativePrior` and :class:`RecencyPrior` by distance, :class:`ALiBi`),
causal and keep/padding masks (:func:`causal_bias`, :func:`key_bias`).
"""

import importlib

# Names resolve on first use (PEP 562), so `import masklab` (and so `masklab --help`, or a
# Ctrl-C at start-up) does not wait for torch.
_WHERE = {
    "MLP": "priors.attention",
    "Attention": "priors.attention",
    "Block": "priors.attention",
    "ALiBi": "priors.bias",
    "MaskPrior": "priors.bias",
    "RecencyPrior": "priors.bias",
    "RelativePrior": "priors.bias",
    "causal_bias": "priors.bias",
    "key_bias": "priors.bias",
    "QK_INITS": "priors.qk_init",
    "MasklabError": "util.errors",
    "Checkpoint": "lab.runner",
    "RunSpec": "lab.runner",
    "run_study": "lab.runner",
    "DESIGNS": "priors.structures",
    "allowed_mass": "priors.structures",
    "design_structure": "priors.structures",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"masklab.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'masklab' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = [
    "Attention",
    "Block",
    "MLP",
    "MaskPrior",
    "RelativePrior",
    "RecencyPrior",
    "ALiBi",
    "causal_bias",
    "key_bias",
    "QK_INITS",
    "allowed_mass",
    "DESIGNS",
    "design_structure",
    "Checkpoint",
    "MasklabError",
    "RunSpec",
    "run_study",
]
