"""The weight-decay rule of every masklab model, stated once.

Weight decay goes on the **weight matrices that multiply activations**: the ``weight`` of
every ``nn.Linear`` (attention projections, MLPs, patch embedding, heads) and every token
embedding table (``nn.Embedding``: a linear map of a one-hot input; in the GPT it is also
the tied output head). Nothing else is decayed:

* biases and LayerNorm gains/offsets (1-D shifts and scales, not capacity);
* additive position embeddings and CLS tokens (``pos``, ``cls``: learned constants added to
  the tokens; decay pulls them toward "no position", the convention of minGPT and timm's
  ``no_weight_decay``);
* attention priors (a :class:`~masklab.priors.bias.MaskPrior`'s ``M``): decay would pull ``M`` to 0,
  a uniform ``logsigmoid(0)`` bias, i.e. erase the prior under study.

:func:`param_groups` turns the rule into AdamW parameter groups; the training loop
(:mod:`masklab.lab.train`) is its one user.
"""

from __future__ import annotations

from torch import nn


def decayed(model: nn.Module) -> set[int]:
    """``id`` of every parameter of ``model`` that gets weight decay (see the module docstring).
    A table named ``pos`` holds positions, so it is not decayed even as an ``nn.Embedding``."""
    out = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) or (isinstance(module, nn.Embedding) and name.rpartition(".")[2] != "pos"):
            out.add(id(module.weight))
    return out


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups of ``model``'s trainable parameters: ``[decayed (weight_decay),
    the rest (0.0)]``, each in ``model.parameters()`` order (a tied weight appears once)."""
    decay = decayed(model)
    params = [q for q in model.parameters() if q.requires_grad]
    return [
        {"params": [q for q in params if id(q) in decay], "weight_decay": weight_decay},
        {"params": [q for q in params if id(q) not in decay], "weight_decay": 0.0},
    ]
