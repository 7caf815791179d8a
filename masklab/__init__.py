"""masklab: structure in transformer attention.

One attention core (:class:`Attention`, :class:`Block`) whose logits are a sum of
additive bias terms: learnable mask priors (:class:`MaskPrior`, ``logsigmoid(M)``;
:class:`RelativePrior` and :class:`RecencyPrior` by distance, :class:`ALiBi`),
causal and keep/padding masks (:func:`causal_bias`, :func:`key_bias`).
"""

from masklab.attention import MLP, Attention, Block
from masklab.bias import ALiBi, MaskPrior, RecencyPrior, RelativePrior, causal_bias, key_bias
from masklab.qk_init import QK_INITS
from masklab.errors import MasklabError
from masklab.runner import Checkpoint, RunSpec, run_study
from masklab.structures import DESIGNS, allowed_mass, design_structure

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
