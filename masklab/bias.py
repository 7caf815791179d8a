"""Additive attention-logit bias terms.

All structure in masklab is a bias added to attention logits (see :mod:`masklab.attention`):

* :class:`MaskPrior` - the learnable soft prior ``logsigmoid(M)`` (<= 0, can only suppress);
* :func:`causal_bias` - ``-inf`` above the diagonal;
* :func:`key_bias` - ``-inf`` on the keys a boolean keep-mask drops (padding, hidden
  context items, a router's discarded items).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PriorMode = Literal["learnable", "frozen", "hard"]
PRIOR_MODES = ("learnable", "frozen", "hard")


def causal_bias(seq: int, device: torch.device | str | None = None) -> Tensor:
    """``(seq, seq)`` bias: 0 on and below the diagonal, ``-inf`` above (query i sees keys <= i)."""
    upper = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(seq, seq, device=device).masked_fill(upper, float("-inf"))


def key_bias(keep: Tensor) -> Tensor:
    """Bias from a keep-mask over keys.

    keep: ``(B, T)`` bool, True = key visible. Returns ``(B, 1, 1, T)``: 0 where kept,
    ``-inf`` where dropped; it broadcasts over heads and queries.
    """
    if keep.dtype != torch.bool:
        raise TypeError(f"keep must be a bool tensor, got {keep.dtype}")
    bias = torch.zeros(keep.shape, device=keep.device).masked_fill(~keep, float("-inf"))
    return bias[:, None, None, :]


class MaskPrior(nn.Module):
    """Learnable additive attention prior ``logsigmoid(M)``.

    ``M`` is initialised from a structure matrix ``S`` with values in [0, 1]
    (1 = tokens should interact, 0 = suppressed; real values interpolate):

        M0 = allowed * S - suppressed * (1 - S)

    so that an allowed entry costs ``logsigmoid(allowed)`` (about 0) and a suppressed one
    about ``-suppressed``.

    Args:
        structure: ``(T, T)`` (one pattern shared by all heads) or ``(H, T, T)`` (per head).
        allowed, suppressed: init strengths ``a`` and ``b`` (positive numbers).
        mode: ``"learnable"`` (M is trained), ``"frozen"`` (M fixed at M0), or ``"hard"``
            (learnable on allowed entries, ``-inf`` where ``S == 0``, like a hard mask).
        heads: with a ``(T, T)`` structure, give each of ``heads`` heads its own learnable
            copy of M (default: one M shared by all heads).

    ``forward(T)`` returns the ``(H|1, T, T)`` bias for a sequence of length ``T`` (the
    top-left block when ``T`` is shorter than the structure).
    """

    def __init__(
        self,
        structure: Tensor,
        allowed: float = 6.0,
        suppressed: float = 6.0,
        mode: PriorMode = "learnable",
        heads: int | None = None,
    ) -> None:
        super().__init__()
        if mode not in PRIOR_MODES:
            raise ValueError(f"unknown prior mode {mode!r}; choose one of {PRIOR_MODES}")
        s = torch.as_tensor(structure, dtype=torch.float32)
        if s.dim() == 2:
            s = s[None] if heads is None else s.expand(heads, -1, -1)
        if s.dim() != 3 or s.shape[-1] != s.shape[-2]:
            raise ValueError(f"structure must be (T, T) or (H, T, T), got {tuple(structure.shape)}")
        if s.min() < 0 or s.max() > 1:
            raise ValueError("structure values must lie in [0, 1]")
        self.mode = mode
        m0 = allowed * s - suppressed * (1 - s)
        self.register_buffer("m0", m0.clone())
        self.register_buffer("hard", s == 0)
        self.m = nn.Parameter(m0.clone(), requires_grad=(mode != "frozen"))

    def forward(self, seq: int | None = None) -> Tensor:
        seq = self.m.shape[-1] if seq is None else seq
        if seq > self.m.shape[-1]:
            raise ValueError(f"sequence length {seq} exceeds the prior's size {self.m.shape[-1]}")
        bias = F.logsigmoid(self.m[:, :seq, :seq])
        if self.mode == "hard":
            bias = bias.masked_fill(self.hard[:, :seq, :seq], float("-inf"))
        return bias

    def drift(self) -> float:
        """Mean absolute change of the bias ``logsigmoid(M)`` since initialisation."""
        with torch.no_grad():
            return (F.logsigmoid(self.m) - F.logsigmoid(self.m0)).abs().mean().item()

    def extra_repr(self) -> str:
        return f"heads={self.m.shape[0]}, size={self.m.shape[-1]}, mode={self.mode}"


class ALiBi(nn.Module):
    """Fixed linear distance bias (Press et al., ALiBi): ``-slope_h * (i - j)`` for key
    ``j <= i``, 0 above the diagonal (the causal mask removes those keys anyway).

    Slopes are the geometric sequence ``2 ** (-8 (h + 1) / H)``. ``forward(T)`` returns
    ``(H, T, T)``. No parameters: position enters only through this bias."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
        self.register_buffer("slopes", slopes, persistent=False)

    def forward(self, seq: int) -> Tensor:
        i = torch.arange(seq, device=self.slopes.device)
        dist = (i[:, None] - i[None, :]).clamp_min(0).float()  # (T, T)
        return -self.slopes[:, None, None] * dist

    def extra_repr(self) -> str:
        return f"heads={len(self.slopes)}"
