"""The one attention core of masklab.

Every model, intervention and router in masklab goes through :class:`Attention`:

    logits = q k^T / sqrt(d_head) + prior() + bias
    y      = softmax(logits) v

* ``prior`` is an optional learnable module owned by the layer (a :class:`~masklab.bias.MaskPrior`
  returns ``logsigmoid(M)``, always <= 0);
* ``bias`` is the sum of the caller's additive terms for this forward pass: causal mask,
  padding, hidden context items, a router's keep-mask (``-inf`` entries), built with the
  helpers in :mod:`masklab.bias`;
* an optional per-example ``query_scale`` multiplies ``q`` (an inverse temperature, e.g. a
  router's ``log n`` length scaling).

The default path is ``torch.nn.functional.scaled_dot_product_attention``. ``return_probs=True``
switches to an eager path that also returns the attention probabilities (for analysis);
both paths agree to float precision (tested).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn


class Attention(nn.Module):
    """Multi-head self-attention with additive logit biases.

    Args:
        dim: model width ``D``.
        heads: number of heads ``H`` (``D`` must be divisible by ``H``).
        prior: optional module called as ``prior(T)`` that returns a ``(H|1, T, T)`` bias.
    """

    def __init__(self, dim: int, heads: int, prior: nn.Module | None = None) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.prior = prior

    def logit_bias(self, seq: int, bias: Tensor | None) -> Tensor | None:
        """Sum of the prior and the caller's bias: ``(B|1, H|1, seq, seq)`` or ``None``."""
        terms = [b for b in (self.prior(seq) if self.prior is not None else None, bias) if b is not None]
        if not terms:
            return None
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return total

    def forward(
        self, x: Tensor, bias: Tensor | None = None, return_probs: bool = False, query_scale: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x: ``(B, T, D)``; bias: additive ``(B|1, H|1, T, T)`` (``-inf`` allowed);
        query_scale: optional ``(B,)`` factor on every query of an example, i.e. a per-example
        inverse temperature of the logits (e.g. ``log n`` length scaling).

        Returns ``(y, probs)``: ``y`` is ``(B, T, D)``; ``probs`` is ``(B, H, T, T)`` when
        ``return_probs`` else ``None``. A query row whose keys are all ``-inf`` is undefined
        (NaN): callers always leave each query at least one key (itself).
        """
        B, T, _ = x.shape
        shape = (B, T, self.heads, self.head_dim)
        q = self.q(x).view(shape).transpose(1, 2)  # (B, H, T, dh)
        if query_scale is not None:
            q = q * query_scale.view(B, 1, 1, 1).to(q.dtype)
        k = self.k(x).view(shape).transpose(1, 2)
        v = self.v(x).view(shape).transpose(1, 2)
        mask = self.logit_bias(T, bias)
        if mask is not None:
            mask = mask.to(q.dtype)
        probs = None
        if return_probs:
            logits = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, H, T, T)
            if mask is not None:
                logits = logits + mask
            probs = logits.softmax(dim=-1)
            y = probs @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(B, T, self.dim)
        return self.out(y), probs

    def logits(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """Pre-softmax logits ``(B, H, T, T)`` of x ``(B, T, D)``: ``q.k / sqrt(dh)`` plus the
        prior and ``bias`` (what :meth:`forward` softmaxes; used to fit W_Q, W_K)."""
        B, T, _ = x.shape
        shape = (B, T, self.heads, self.head_dim)
        q = self.q(x).view(shape).transpose(1, 2)
        k = self.k(x).view(shape).transpose(1, 2)
        logits = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = self.logit_bias(T, bias)
        return logits if mask is None else logits + mask.to(logits.dtype)


class MLP(nn.Module):
    """Position-wise feed-forward: ``(B, T, D) -> (B, T, D)``."""

    def __init__(self, dim: int, hidden: int | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, hidden or 4 * dim)
        self.proj = nn.Linear(hidden or 4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, dim: int, heads: int, prior: nn.Module | None = None, mlp_hidden: int | None = None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, prior)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_hidden)

    def forward(
        self, x: Tensor, bias: Tensor | None = None, return_probs: bool = False, query_scale: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x: ``(B, T, D)`` -> ``((B, T, D), probs (B, H, T, T) or None)``; see :meth:`Attention.forward`."""
        a, probs = self.attn(self.ln1(x), bias, return_probs, query_scale)
        x = x + a
        return x + self.mlp(self.ln2(x)), probs
