"""Query-key side baselines: put a prior's structure into W_Q, W_K instead of a mask.

Each init is a small class with one method, ``apply(model, inputs, structures)``, picked by
name from :data:`QK_INITS`:

* ``vanilla`` - leaves the default initialisation;
* ``qk-svd`` - per block, solves the least-squares problem
  ``X A X^T / sqrt(d_head) ~= target logits`` (row-centred, over init-time block inputs
  ``X``) for ``A = W_Q^T W_K`` and splits each head's ``A`` by truncated SVD into its
  rank-``d_head`` ``W_Q``, ``W_K``;
* ``qk-opt`` - per block, optimises ``W_Q``, ``W_K`` (Adam) so that the softmax attention on
  init-time inputs matches the target attention ``softmax(target logits)`` in KL.

Target logits are exactly the bias the corresponding mask prior would add,
``logsigmoid(a S - b (1 - S))``, so at step 0 a QK-initialised model attends like the
mask model (check it with :func:`masklab.priors.structures.allowed_mass`). Blocks are fitted in order, each on the
inputs produced by the already-initialised blocks below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from masklab.util.registry import Registry

QK_INITS: Registry["QKInit"] = Registry("QK init", instantiate=True)
register = QK_INITS.register


def target_logits(structure: Tensor, allowed: float = 6.0, suppressed: float = 6.0) -> Tensor:
    """The mask prior's bias for a structure in [0, 1]: ``(H|1, T, T)``."""
    return F.logsigmoid(allowed * structure - suppressed * (1 - structure))


def block_inputs(model: nn.Module, tokens: Tensor, upto: int) -> Tensor:
    """Input of block ``upto``'s attention (after its LayerNorm): ``(B, T, D)``.

    ``model`` has ``embed(tokens)``, ``base_bias(T)`` and ``blocks`` (every masklab model)."""
    with torch.no_grad():
        x = model.embed(tokens)
        bias = model.base_bias(x.shape[1], x.device)
        for block in model.blocks[:upto]:
            x, _ = block(x, bias)
        return model.blocks[upto].ln1(x)


class QKInit:
    name = "base"

    def apply(
        self, model: nn.Module, inputs: Tensor, structures: list[Tensor], allowed: float = 6.0, suppressed: float = 6.0
    ) -> None:
        """Initialise every block's W_Q, W_K of ``model`` (any masklab model: ``embed``,
        ``base_bias``, ``blocks``) from one structure ``(H|1, T, T)`` per block, using
        sample inputs ``(B, n)``. (For a causal model, fit only what the causal mask allows.)"""
        for layer, s in enumerate(structures):
            attn = model.blocks[layer].attn
            x = block_inputs(model, inputs, layer)
            t = target_logits(s, allowed, suppressed).expand(attn.heads, -1, -1)
            with torch.no_grad():
                self.fit(attn, x, t)

    def fit(self, attn: nn.Module, x: Tensor, target: Tensor) -> None:
        """Set ``attn.q``/``attn.k`` so logits on ``x (B, T, D)`` match ``target (H, T, T)``."""


@register("vanilla")
class Vanilla(QKInit):
    def apply(self, *args, **kwargs) -> None:
        return None


@register("qk-svd")
@dataclass
class SVD(QKInit):
    ridge: float = 1e-6

    def fit(self, attn: nn.Module, x: Tensor, target: Tensor) -> None:
        # min_A sum_b || X_b A K_b^T - R ||^2 with K_b = X_b centred over tokens (centring the
        # keys removes per-row constants, to which softmax is blind). Normal equations:
        # sum_b (X_b^T X_b) A (K_b^T K_b) = sum_b X_b^T R K_b, a (D*D, D*D) linear system.
        B, T, D = x.shape
        dh = attn.head_dim
        x64 = x.double()
        k64 = x64 - x64.mean(dim=1, keepdim=True)
        xtx = x64.transpose(1, 2) @ x64  # (B, D, D)
        ktk = k64.transpose(1, 2) @ k64
        gram = torch.einsum("bpr,bqs->pqrs", xtx, ktk).reshape(D * D, D * D)
        gram += self.ridge * gram.diagonal().mean() * torch.eye(D * D, dtype=gram.dtype)
        centred = target - target.mean(dim=-1, keepdim=True)  # (H, T, T)
        rhs = torch.einsum("bip,hij,bjq->hpq", x64, centred.double() * math.sqrt(dh), k64).reshape(-1, D * D)
        solution = torch.linalg.solve(gram, rhs.T).T.reshape(-1, D, D).float()  # (H, D, D)
        attn.q.bias.zero_()
        attn.k.bias.zero_()
        for h in range(attn.heads):
            u, sv, vt = torch.linalg.svd(solution[h])
            root = sv[:dh].sqrt()
            rows = slice(h * dh, (h + 1) * dh)
            attn.q.weight[rows] = (u[:, :dh] * root).T  # q = x W_q^T, so q k^T = x U S V^T x^T
            attn.k.weight[rows] = root[:, None] * vt[:dh]


@register("qk-opt")
@dataclass
class Opt(QKInit):
    steps: int = 300
    lr: float = 0.02

    def fit(self, attn: nn.Module, x: Tensor, target: Tensor) -> None:
        """Adam on W_Q, W_K (in place) to minimise KL(softmax(target) || attention) over ``x``."""
        want = target.softmax(-1)  # (H, T, T)
        opt = torch.optim.Adam([attn.q.weight, attn.k.weight], lr=self.lr)
        with torch.enable_grad():
            for _ in range(self.steps):
                logp = attn.logits(x).log_softmax(-1)  # (B, H, T, T), the core's own logits
                loss = (want * (want.clamp_min(1e-12).log() - logp)).sum(-1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        for q in attn.parameters():
            q.grad = None


# ----------------------------------------------------------------------------- vision inits
# Study A's vision baselines (issue 7). ``default`` leaves the ViT's own init; ``mimetic``
# and ``impulse`` are structured QK-side inits. They share :class:`QKInit`'s ``apply``
# signature; ``mimetic`` ignores the structures.


@register("default")
class Default(Vanilla):
    """The model's own initialisation (the vision tables' name for ``vanilla``)."""


def _split(product: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Factor ``product (D, D) ~= L @ R`` with ``L (D, rank)``, ``R (rank, D)`` by truncated SVD."""
    u, s, vt = torch.linalg.svd(product.double())
    root = s[:rank].sqrt()
    return (u[:, :rank] * root).float(), (root[:, None] * vt[:rank]).float()


@register("mimetic")
@dataclass
class Mimetic(QKInit):
    """Trockman & Kolter (2023), "Mimetic initialization of self-attention layers": per head
    ``W_Q^T W_K ~= alpha1 Z1 + beta1 I`` (so q.k starts near x.x: tokens attend to similar
    tokens) and per block ``W_V^T W_O^T ~= alpha2 Z2 - beta2 I`` (the attention output
    starts near minus its input), ``Z ~ N(0, 1/D)`` fresh per head/block (torch's RNG)."""

    alpha1: float = 0.7
    beta1: float = 0.7
    alpha2: float = 0.4
    beta2: float = 0.4

    def apply(
        self, model: nn.Module, inputs: Tensor, structures: list[Tensor], allowed: float = 6.0, suppressed: float = 6.0
    ) -> None:
        with torch.no_grad():
            for block in model.blocks:
                attn = block.attn
                D, dh = attn.dim, attn.head_dim
                eye = torch.eye(D)
                for h in range(attn.heads):
                    qk = self.alpha1 * torch.randn(D, D) / math.sqrt(D) + self.beta1 * eye
                    left, right = _split(qk, dh)  # q k^T = x W_q^T W_k x^T with W_q^T = left, W_k = right
                    rows = slice(h * dh, (h + 1) * dh)
                    attn.q.weight[rows] = left.T
                    attn.k.weight[rows] = right
                vo = self.alpha2 * torch.randn(D, D) / math.sqrt(D) - self.beta2 * eye
                left, right = _split(vo, D)  # out = x W_v^T W_o^T with W_v^T = left, W_o^T = right
                attn.v.weight.copy_(left.T)
                attn.out.weight.copy_(right.T)
                for lin in (attn.q, attn.k, attn.v, attn.out):
                    lin.bias.zero_()


@register("impulse")
@dataclass
class Impulse(QKInit):
    """Structured convolutional impulse init (Zheng et al.): each head's attention at init
    approximates a convolution impulse, i.e. query patch (r, c) attends to patch
    (r + dr_h, c + dc_h) (structures from :func:`masklab.priors.structures.impulse_2d`).

    Attention is made position-driven: the position embeddings ``P (T, D)`` are reset to
    random orthogonal rows of per-coordinate std ``pos_scale`` (so they dominate the patch
    content at init), then per block and head ``W_Q^T W_K = A_h`` with
    ``A_h = pinv(X) R_h pinv(X)^T sqrt(d_head)``, ``X (T, D)`` the block's mean init-time
    input over ``inputs`` and ``R_h`` the row-centred target logits; ``A_h`` is split to rank
    ``d_head`` by SVD. Needs a model with a ``pos`` parameter (the ViT)."""

    pos_scale: float = 1.0

    def apply(
        self, model: nn.Module, inputs: Tensor, structures: list[Tensor], allowed: float = 6.0, suppressed: float = 6.0
    ) -> None:
        with torch.no_grad():
            T, D = model.pos.shape
            basis, _ = torch.linalg.qr(
                torch.randn(D, T) if D >= T else torch.randn(T, D).T
            )  # (D, min(T, D)) orthonormal
            pos = basis.T if D >= T else torch.randn(T, D)
            model.pos.copy_(pos / pos.std() * self.pos_scale)
        super().apply(model, inputs, structures, allowed, suppressed)

    def fit(self, attn: nn.Module, x: Tensor, target: Tensor) -> None:
        dh = attn.head_dim
        xm = x.double().mean(dim=0)  # (T, D)
        pinv = torch.linalg.pinv(xm)  # (D, T)
        centred = (target - target.mean(dim=-1, keepdim=True)).double() * math.sqrt(dh)  # (H, T, T)
        attn.q.bias.zero_()
        attn.k.bias.zero_()
        for h in range(attn.heads):
            left, right = _split(pinv @ centred[h] @ pinv.T, dh)
            rows = slice(h * dh, (h + 1) * dh)
            attn.q.weight[rows] = left.T
            attn.k.weight[rows] = right
