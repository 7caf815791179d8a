"""Additive attention-logit bias terms.

All structure in masklab is a bias added to attention logits (see :mod:`masklab.priors.attention`):

* :class:`MaskPrior` - the learnable soft prior ``logsigmoid(M)`` (<= 0, can only suppress);
* :class:`RelativePrior` - a learnable per-head ``logsigmoid`` bias over relative distance
  (defined for any length; what :mod:`masklab.pretrained.hf` attaches to pretrained models);
* :class:`RecencyPrior` - one learnable slope per head over ``log(1 + distance)``
  (monotone in distance, so it cannot single out particular distances);
* :func:`causal_bias` - ``-inf`` above the diagonal;
* :func:`key_bias` - ``-inf`` on the keys a boolean keep-mask drops (padding, hidden
  context items, a router's discarded items).
"""

from __future__ import annotations

from typing import Literal

import math

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

    @classmethod
    def uniform(cls, shape: tuple[int, ...] | torch.Size, mode: PriorMode = "learnable") -> "MaskPrior":
        """A prior of ``shape`` ``(H|1, T, T)`` with no structure: ``M = 0`` everywhere.

        The bias ``logsigmoid(0) = -log 2`` is the same for every key, so softmax attention is
        exactly unchanged at initialisation; what it adds is the learnable ``(H|1, T, T)``
        parameter itself (the ``mask-zero`` control, :data:`masklab.lab.train.UNSTRUCTURED`).
        ``M = 0`` rather than ``M = allowed`` everywhere (also uniform): at 0 ``logsigmoid``
        has its largest slope (1/2), so every entry is free to learn a pattern; at
        ``allowed`` = 6 its slope is 0.0025 and the control would be nearly frozen, so a gap
        to ``mask`` could be blamed on a control that cannot learn. 0 is also where weight
        decay would pull ``M`` (:mod:`masklab.models.optim`)."""
        return cls(torch.ones(tuple(shape)), allowed=0.0, suppressed=0.0, mode=mode)

    def forward(self, seq: int | None = None, keys: int | None = None, offset: int = 0) -> Tensor:
        """``(H|1, seq, keys)`` bias of queries ``[offset, offset + seq)`` against keys
        ``[0, keys)`` (``keys`` defaults to ``offset + seq``; ``forward(T)`` is the square
        ``(T, T)`` block). Decoding with a KV cache asks for ``forward(1, T, T - 1)``."""
        seq = self.m.shape[-1] if seq is None else seq
        keys = offset + seq if keys is None else keys
        size = self.m.shape[-1]
        if offset + seq > size or keys > size:
            raise ValueError(f"positions up to {max(offset + seq, keys)} exceed the prior's size {size}")
        bias = F.logsigmoid(self.m[:, offset : offset + seq, :keys])
        if self.mode == "hard":
            bias = bias.masked_fill(self.hard[:, offset : offset + seq, :keys], float("-inf"))
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


def relative_buckets(distance: Tensor, exact: int, max_distance: int, n_log: int) -> Tensor:
    """Bucket of each non-negative relative distance ``i - j`` (negative distances, i.e.
    future keys, share bucket 0 with distance 0; a causal mask removes them anyway).

    Distances ``< exact`` get their own bucket; ``[exact, max_distance)`` share ``n_log``
    log-spaced buckets (as in T5); everything ``>= max_distance`` falls in the last one.
    Returns a long tensor of ``distance``'s shape with values in ``[0, exact + n_log)``.
    """
    d = distance.clamp_min(0)
    if n_log == 0 or max_distance <= exact:
        return d.clamp_max(exact - 1)
    far = d.clamp_min(exact).float()
    log_b = exact + (torch.log(far / exact) / math.log(max_distance / exact) * n_log).long()
    log_b = log_b.clamp_max(exact + n_log - 1)
    return torch.where(d < exact, d, log_b)


class RelativePrior(nn.Module):
    """Learnable per-head prior over relative distance: ``logsigmoid(theta[h, bucket(i - j)])``.

    Defined for any sequence length (distances beyond ``max_distance`` share the last
    bucket), so it fits pretrained models of any context. Like :class:`MaskPrior` it is
    ``<= 0`` and can only suppress; at initialisation every bucket holds ``allowed``, a
    constant per row, which leaves softmax attention exactly unchanged.

    Args:
        heads: number of query heads ``H``.
        max_distance: distances from here on share the last bucket.
        exact: distances ``0 .. exact - 1`` each have their own bucket.
        log_buckets: log-spaced buckets covering ``[exact, max_distance)``.
        allowed: initial value of every ``theta`` entry.

    ``forward(Tq, Tk=None, offset=0)`` returns the ``(H, Tq, Tk)`` bias of queries
    ``[offset, offset + Tq)`` against keys ``[0, Tk)`` (``Tk`` defaults to ``offset + Tq``).
    """

    def __init__(
        self, heads: int, max_distance: int = 1024, exact: int = 16, log_buckets: int = 16, allowed: float = 6.0
    ) -> None:
        super().__init__()
        if heads < 1 or exact < 1 or log_buckets < 0 or max_distance < 1:
            raise ValueError("heads and exact must be >= 1, log_buckets >= 0, max_distance >= 1")
        self.heads, self.max_distance, self.exact, self.log_buckets = heads, max_distance, exact, log_buckets
        self.allowed = float(allowed)
        self.theta = nn.Parameter(torch.full((heads, exact + log_buckets), float(allowed)))

    def config(self) -> dict:
        """Constructor arguments (what a priors file records to rebuild this module)."""
        return {
            "heads": self.heads,
            "max_distance": self.max_distance,
            "exact": self.exact,
            "log_buckets": self.log_buckets,
            "allowed": self.allowed,
        }

    def buckets(self, seq: int, keys: int | None = None, offset: int = 0) -> Tensor:
        """``(seq, keys)`` bucket indices of queries ``[offset, offset + seq)`` vs keys ``[0, keys)``."""
        keys = offset + seq if keys is None else keys
        i = torch.arange(offset, offset + seq, device=self.theta.device)
        j = torch.arange(keys, device=self.theta.device)
        return relative_buckets(i[:, None] - j[None, :], self.exact, self.max_distance, self.log_buckets)

    def forward(self, seq: int, keys: int | None = None, offset: int = 0) -> Tensor:
        return F.logsigmoid(self.theta)[:, self.buckets(seq, keys, offset)]  # (H, seq, keys)

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, exact={self.exact}, log_buckets={self.log_buckets}, max_distance={self.max_distance}"
        )


class RecencyPrior(nn.Module):
    """Learnable per-head monotone bias over relative distance: ``-slope[h] * log(1 + i - j)``.

    One parameter per head. A positive slope prefers nearer keys, a negative one farther
    keys; unlike :class:`RelativePrior` it cannot prefer one distance over its neighbours,
    so what it learns transfers to distances never trained on as a ranking (nearer vs
    farther). ``slope`` starts at ``init`` (0: no bias, outputs unchanged). Unlike the
    other priors it is not ``<= 0`` for negative slopes.

    ``forward(Tq, Tk=None, offset=0)`` returns the ``(H, Tq, Tk)`` bias of queries
    ``[offset, offset + Tq)`` against keys ``[0, Tk)`` (``Tk`` defaults to ``offset + Tq``).
    """

    def __init__(self, heads: int, init: float = 0.0) -> None:
        super().__init__()
        if heads < 1:
            raise ValueError("heads must be >= 1")
        self.heads, self.init = heads, float(init)
        self.slope = nn.Parameter(torch.full((heads,), float(init)))

    def config(self) -> dict:
        """Constructor arguments (what a priors file records to rebuild this module)."""
        return {"heads": self.heads, "init": self.init}

    def forward(self, seq: int, keys: int | None = None, offset: int = 0) -> Tensor:
        keys = offset + seq if keys is None else keys
        i = torch.arange(offset, offset + seq, device=self.slope.device)
        j = torch.arange(keys, device=self.slope.device)
        d = (i[:, None] - j[None, :]).clamp(min=0).to(self.slope.dtype)  # future keys are masked by the caller
        return -self.slope[:, None, None] * torch.log1p(d)  # (H, seq, keys)

    def extra_repr(self) -> str:
        return f"heads={self.heads}"
