"""The one attention core of masklab.

Every model, intervention and router in masklab goes through :class:`Attention`:

    logits = q k^T / sqrt(d_head) + prior() + bias
    y      = softmax(logits) v

* ``prior`` is an optional learnable module owned by the layer (a :class:`~masklab.priors.bias.MaskPrior`
  returns ``logsigmoid(M)``, always <= 0);
* ``bias`` is the sum of the caller's additive terms for this forward pass: causal mask,
  padding, hidden context items, a router's keep-mask (``-inf`` entries), built with the
  helpers in :mod:`masklab.priors.bias`;
* an optional per-example ``query_scale`` multiplies ``q`` (an inverse temperature, e.g. a
  router's ``log n`` length scaling).

The default path is ``torch.nn.functional.scaled_dot_product_attention``. ``return_attn=True``
switches to an eager path that also returns the attention probabilities (for analysis);
both paths agree to float precision (tested).

Learnable priors. PyTorch's fused SDPA kernels return no gradient for ``attn_mask``, so a
mask that requires grad sends SDPA to its math kernel, which materialises several
``(B, H, T, T)`` tensors. ``Attention(impl=...)`` picks how a prior that requires grad is
handled (no prior and ``return_attn`` are unaffected):

* ``"math"`` - the reference: SDPA with the summed mask (its math kernel);
* ``"blocked"`` - :class:`BlockedBiasAttention` (CPU): forward by SDPA's CPU flash kernel
  (which also returns the log-sum-exp), backward by recomputing ``P`` in blocks of batch
  items and query rows that fit in cache, giving the q, k, v and bias gradients from one
  recompute. The bias gradient is summed over the batch block by block, so it needs
  ``(H|1, T, T)`` memory, never ``(B, H, T, T)``. A relative (per-distance) prior gets the
  same path: the gradient of its ``(H|1, T, T)`` output flows back through the prior's own
  indexing, which sums it along diagonals;
* ``"flex"`` - FlexAttention (:func:`flex_attention_bias`, the GPU path): the prior and the
  caller's bias are captured tensors read in ``score_mod`` (``score + prior[h, q, k] +
  bias[b, h, q, k]``), so the fused kernel computes the forward and the backward, including
  the gradient of the captured prior. On CUDA the call is compiled (``torch.compile``, once
  per shape); on the CPU FlexAttention runs eagerly and has no backward, so ``"flex"`` serves
  there only forward passes without gradients (the CPU tests compare it with the math path);
* ``"auto"`` (default) - for ``T >= MIN_FAST_SEQ`` (128): on the CPU ``"blocked"`` in
  float32/float64 when the op is available, else ``"math"``; on CUDA ``"flex"`` when this
  torch has FlexAttention, else ``"math"``. Shorter sequences stay on ``"math"`` on every
  device: on the CPU as fast at T = 16, and every study at its default size (T <= 64)
  computes exactly what it did before (at T = 64 the blocked path is faster in attention
  alone but was not in the LM study's whole training step; see
  benchmarks/attention_overhead.py; ``scripts/device_check.py`` measures the CUDA side).

Frozen priors and masks (nothing requires grad) go to SDPA as a 4-D mask wherever a fused
kernel takes one: on CUDA always (its memory-efficient kernel takes an additive mask), on the
CPU with ``"blocked"`` and ``"auto"`` at ``T >= 128`` (its flash kernel takes 2-D or 4-D
masks; a 3-D mask sends SDPA to its math kernel).

Asking for ``"blocked"`` or ``"flex"`` where it cannot run (``"blocked"``: CUDA, other
dtypes, a torch without the CPU flash op; ``"flex"``: a torch without FlexAttention, a
backward on the CPU, a head dim FlexAttention's GPU kernels do not take) falls back to
``"math"`` with one logged warning.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger(__name__)

AttentionImpl = Literal["auto", "math", "blocked", "flex"]
ATTENTION_IMPLS = ("auto", "math", "blocked", "flex")

# "auto" leaves sequences shorter than this on the math path (see the module docstring;
# benchmarks/attention_overhead.py: at T = 16 math was as fast, and the study models' training
# steps, T <= 64, were no faster on the blocked path)
MIN_FAST_SEQ = 128

# bytes of one (batch items x heads x query rows x keys) tile of P in the blocked backward:
# about one core's L2 cache (measured by benchmarks/attention_overhead.py on a 1 MiB-L2 CPU)
BLOCK_BYTES = 1 << 20

_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
try:
    from torch.nn.attention.flex_attention import flex_attention as _FLEX
except ImportError:  # a torch older than 2.5
    _FLEX = None
_warned: set[str] = set()
_flex_failed: list[str] = []  # the reason the compiled flex kernel failed once in this process (then: math)
_flex_compiled = None


def _warn_once(reason: str, path: str = "blocked") -> None:
    if (path, reason) not in _warned:
        _warned.add((path, reason))
        log.warning("masklab: %s attention unavailable (%s); using the math path", path, reason)


def blocked_unavailable(q: Tensor) -> str | None:
    """Why :class:`BlockedBiasAttention` cannot run on ``q``, or ``None`` when it can."""
    if _FLASH_CPU is None:
        return "this torch has no aten._scaled_dot_product_flash_attention_for_cpu"
    if q.device.type != "cpu":
        return f"device {q.device.type} (impl='flex', which 'auto' picks on CUDA, is the GPU path)"
    if q.dtype not in (torch.float32, torch.float64):
        return f"dtype {q.dtype}"
    return None


class BlockedBiasAttention(torch.autograd.Function):
    """``softmax(q k^T / sqrt(dh) + prior + bias) v`` with gradients for q, k, v and ``prior``.

    q, k, v: ``(B, H, T, dh)``; prior: ``(H|1, T, T)`` (the learnable term); bias:
    ``(B|1, H|1, T, T)`` or ``None`` (constant: causal, padding, ``-inf`` keys). Returns
    ``(B, H, T, dh)``. Forward: SDPA's CPU flash kernel, keeping the log-sum-exp ``L``.
    Backward, per tile of batch items and query rows (``BLOCK_BYTES`` of ``P``)::

        P  = exp(q k^T / sqrt(dh) + prior + bias - L)
        dV += P^T dO;   dS = P * (dO V^T - rowsum(dO * O))
        dQ = dS K / sqrt(dh);   dK += dS^T Q / sqrt(dh);   dPrior += sum over batch of dS
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, prior: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        mask = prior[None] if bias is None else prior + bias  # (B|1, H|1, T, T)
        out, lse = _FLASH_CPU(q, k, v, attn_mask=mask)
        if mask.shape[0] == 1:  # keep the summed mask: it does not grow with B
            ctx.save_for_backward(q, k, v, mask, None, out, lse)
        else:  # a per-example bias (padding): keep the two terms, add them per tile
            ctx.save_for_backward(q, k, v, prior[None], bias, out, lse)
        ctx.prior_heads = prior.shape[0]
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, None]:  # type: ignore[override]
        q, k, v, mask, bias, out, lse = ctx.saved_tensors  # mask: (1, H|1, T, T)
        B, H, T, dh = q.shape
        scale = 1.0 / math.sqrt(dh)
        dq = torch.empty_like(q)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        dprior = torch.zeros((H, T, T), dtype=q.dtype, device=q.device)
        ones = torch.ones((B, H, T, 1), dtype=q.dtype, device=q.device)
        # fold the row terms into the matmuls: [q/sqrt(dh), -L] . [k, 1] = logits - L and
        # [dO, -delta] . [v, 1] = dO v^T - delta, with delta = rowsum(dO * O)
        qa = torch.cat([q * scale, lse.unsqueeze(-1).neg()], -1)  # (B, H, T, dh + 1)
        ka_t = torch.cat([k, ones], -1).transpose(-2, -1)  # (B, H, dh + 1, T)
        ga = torch.cat([grad_out, (grad_out * out).sum(-1, keepdim=True).neg()], -1)
        va_t = torch.cat([v, ones], -1).transpose(-2, -1)
        row_bytes = H * T * q.element_size()
        if row_bytes * T <= BLOCK_BYTES:  # whole items per tile
            items, rows = max(1, BLOCK_BYTES // (row_bytes * T)), T
        else:  # one item, a band of query rows per tile
            items, rows = 1, max(16, BLOCK_BYTES // row_bytes)
        for b0 in range(0, B, items):
            bs = slice(b0, b0 + items)
            for r0 in range(0, T, rows):
                rs = slice(r0, r0 + rows)
                p = torch.matmul(qa[bs, :, rs], ka_t[bs]).add_(mask[:, :, rs])
                if bias is not None:
                    p.add_(bias[bs if bias.shape[0] > 1 else slice(None), :, rs])
                p = p.exp_()  # P: (items, H, rows, T)
                g = grad_out[bs, :, rs]
                dv[bs] += p.transpose(-2, -1) @ g
                ds = torch.matmul(ga[bs, :, rs], va_t[bs]).mul_(p)  # dS = P * (dP - delta)
                dprior[:, rs] += ds[0] if ds.shape[0] == 1 else ds.sum(0)
                dq[bs, :, rs] = (ds @ k[bs]).mul_(scale)
                dk[bs] += ds.transpose(-2, -1) @ qa[bs, :, rs, :dh]
        if ctx.prior_heads == 1:
            dprior = dprior.sum(0, keepdim=True)
        return dq, dk, dv, dprior, None


def flex_unavailable(q: Tensor, needs_grad: bool) -> str | None:
    """Why :func:`flex_attention_bias` cannot run on ``q`` (``needs_grad``: a backward will
    follow), or ``None`` when it can."""
    if _FLEX is None:
        return "this torch has no torch.nn.attention.flex_attention"
    if _flex_failed:
        return _flex_failed[0]
    if q.device.type == "cpu":
        return "FlexAttention has no backward on the CPU" if needs_grad else None
    if q.device.type != "cuda":
        return f"device {q.device.type}"
    dh = q.shape[-1]
    if dh < 16 or dh & (dh - 1):
        return f"head dim {dh} (FlexAttention's GPU kernels take powers of two >= 16)"
    return None


def _flex_core(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Tensor | None,
    bias: Tensor | None,
    prior_heads: bool,
    bias_items: bool,
    bias_heads: bool,
) -> Tensor:
    """FlexAttention with ``score + prior[h|0, q, k] + bias[b|0, h|0, q, k]`` in ``score_mod``
    (the flags say which dims are not broadcast). Compiled as a whole on CUDA, so the closure
    is traced inside the compiled region and one compile serves every step."""

    def score_mod(score, b, h, qi, ki):
        if prior is not None:
            score = score + prior[h if prior_heads else 0, qi, ki]
        if bias is not None:
            score = score + bias[b if bias_items else 0, h if bias_heads else 0, qi, ki]
        return score

    return _FLEX(q, k, v, score_mod=score_mod)


def flex_attention_bias(q: Tensor, k: Tensor, v: Tensor, prior: Tensor | None, bias: Tensor | None) -> Tensor:
    """``softmax(q k^T / sqrt(dh) + prior + bias) v`` by FlexAttention, with gradients for q,
    k, v and a learnable ``prior``.

    q, k, v: ``(B, H, T, dh)``; prior: ``(H|1, T, T)`` or None; bias: ``(B|1, H|1, T, T)`` or
    None (``-inf`` allowed). Compiled on CUDA (``torch.compile``, ``dynamic=False``); eager
    on the CPU (forward only: FlexAttention has no CPU backward), where torch's
    "called without torch.compile" warning is silenced: the CPU use is the reference test."""
    global _flex_compiled
    flags = (
        prior is not None and prior.shape[0] > 1,
        bias is not None and bias.shape[0] > 1,
        bias is not None and bias.shape[1] > 1,
    )
    if q.device.type != "cuda":
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            return _flex_core(q, k, v, prior, bias, *flags)
    if _flex_compiled is None:
        _flex_compiled = torch.compile(_flex_core, dynamic=False)
    return _flex_compiled(q, k, v, prior, bias, *flags)


def _sum_bias(prior: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """``prior + bias`` where either may be ``None``."""
    if prior is None or bias is None:
        return bias if prior is None else prior
    return prior + bias


class Attention(nn.Module):
    """Multi-head self-attention with additive logit biases.

    Args:
        dim: model width ``D``.
        heads: number of heads ``H`` (``D`` must be divisible by ``H``).
        prior: optional module called as ``prior(T)`` that returns a ``(H|1, T, T)`` bias.
        impl: how a prior that requires grad is computed: ``"auto"``, ``"math"`` (reference),
            ``"blocked"`` (CPU) or ``"flex"`` (FlexAttention, the GPU path; see the module docstring). A plain
            attribute: set it on every layer of a model with :func:`set_attention_impl`.
    """

    def __init__(self, dim: int, heads: int, prior: nn.Module | None = None, impl: AttentionImpl = "auto") -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}")
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"unknown attention impl {impl!r}; choose one of {ATTENTION_IMPLS}")
        self.impl = impl
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.prior = prior

    def logit_bias(self, seq: int, bias: Tensor | None) -> Tensor | None:
        """Sum of the prior and the caller's bias: ``(B|1, H|1, seq, seq)`` or ``None``."""
        return _sum_bias(self.prior(seq) if self.prior is not None else None, bias)

    def forward(
        self, x: Tensor, bias: Tensor | None = None, return_attn: bool = False, query_scale: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x: ``(B, T, D)``; bias: additive ``(B|1, H|1, T, T)`` (``-inf`` allowed);
        query_scale: optional ``(B,)`` factor on every query of an example, i.e. a per-example
        inverse temperature of the logits (e.g. ``log n`` length scaling).

        Returns ``(y, probs)``: ``y`` is ``(B, T, D)``; ``probs`` is ``(B, H, T, T)`` when
        ``return_attn`` else ``None``. A query row whose keys are all ``-inf`` is undefined
        (NaN): callers always leave each query at least one key (itself).
        """
        B, T, _ = x.shape
        shape = (B, T, self.heads, self.head_dim)
        q = self.q(x).view(shape).transpose(1, 2)  # (B, H, T, dh)
        if query_scale is not None:
            q = q * query_scale.view(B, 1, 1, 1).to(q.dtype)
        k = self.k(x).view(shape).transpose(1, 2)
        v = self.v(x).view(shape).transpose(1, 2)
        prior = self.prior(T) if self.prior is not None else None
        fast = self.impl == "blocked" or (self.impl == "auto" and T >= MIN_FAST_SEQ)
        path = None if return_attn else self._fast_path(q, k, v, T, prior, bias)
        if path is not None:
            p4 = None if prior is None else (prior if prior.dim() == 3 else prior.reshape(-1, T, T)).to(q.dtype)
            b4 = bias
            while b4 is not None and b4.dim() < 4:
                b4 = b4[None]
            b4 = None if b4 is None else b4.to(q.dtype)
            if path == "blocked":
                y = BlockedBiasAttention.apply(q, k, v, p4, b4)
            else:
                try:
                    y = flex_attention_bias(q, k, v, p4, b4)
                except torch.OutOfMemoryError:
                    raise
                except Exception as e:  # a kernel or compile failure on the GPU: the math path from now on
                    if q.device.type == "cpu":
                        raise
                    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    _flex_failed.append(f"FlexAttention failed: {type(e).__name__}: {first}")
                    _warn_once(_flex_failed[0], "flex")
                    return self.forward(x, bias, return_attn, query_scale)
            return self.out(y.transpose(1, 2).reshape(B, T, self.dim)), None
        mask = _sum_bias(prior, bias)
        if mask is not None:
            mask = mask.to(q.dtype)
            # SDPA's fused kernels take a 4-D mask (the CPU flash kernel 2-D or 4-D only), so a
            # frozen (H|1, T, T) prior would send it to the math kernel
            if (fast or q.device.type == "cuda") and mask.dim() == 3:
                mask = mask[None]
        probs = None
        if return_attn:
            logits = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, H, T, T)
            if mask is not None:
                logits = logits + mask
            probs = logits.softmax(dim=-1)
            y = probs @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(B, T, self.dim)
        return self.out(y), probs

    def _fast_path(
        self, q: Tensor, k: Tensor, v: Tensor, T: int, prior: Tensor | None, bias: Tensor | None
    ) -> str | None:
        """``"blocked"``, ``"flex"`` or None (SDPA with the summed mask) for this call; see the
        module docstring. Warns once where an asked-for path cannot run."""
        if self.impl == "math" or (bias is not None and bias.requires_grad):
            return None
        learnable = prior is not None and prior.requires_grad  # learnable and grad enabled
        if self.impl == "flex":
            if prior is None and bias is None:
                return None
            needs_grad = learnable or (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
            why = flex_unavailable(q, needs_grad)
            if why is None:
                return "flex"
            _warn_once(why, "flex")
            return None
        if not learnable:
            return None
        if self.impl == "blocked" or (T >= MIN_FAST_SEQ and q.device.type == "cpu"):
            why = blocked_unavailable(q)
            if why is None:
                return "blocked"
            if self.impl == "blocked":
                _warn_once(why)
            return None
        if T >= MIN_FAST_SEQ and flex_unavailable(q, True) is None:  # "auto" off the CPU
            return "flex"
        return None

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


def set_attention_impl(model: nn.Module, impl: AttentionImpl) -> None:
    """Set ``impl`` on every :class:`Attention` layer of ``model`` (e.g. ``"math"`` for a reference run)."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; choose one of {ATTENTION_IMPLS}")
    for module in model.modules():
        if isinstance(module, Attention):
            module.impl = impl


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
        self, x: Tensor, bias: Tensor | None = None, return_attn: bool = False, query_scale: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x: ``(B, T, D)`` -> ``((B, T, D), probs (B, H, T, T) or None)``; see :meth:`Attention.forward`."""
        a, probs = self.attn(self.ln1(x), bias, return_attn, query_scale)
        x = x + a
        return x + self.mlp(self.ln2(x)), probs
