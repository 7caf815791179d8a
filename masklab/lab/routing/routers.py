"""Routers: cheap models that score every context item, so a teacher can read only the best.

These are token routers (:class:`TokenRouter`, :data:`TOKEN_ROUTERS`), inside the toy
models; the document-unit routers of ``masklab compress`` are :class:`masklab.context.router.Router`.

A router reads the same inputs as an :class:`~masklab.models.reader.EvidenceReader`
(``items (B, N, 2)``, ``query (B, 2)``, ``valid (B, N)``, ``positions (B, N)``) and returns one
score (a logit) per item, ``(B, N)``, with ``-inf`` on padding. Registry :data:`TOKEN_ROUTERS`:

* ``transformer`` - a small transformer over one token per item plus the query token, on
  the shared attention core. Items attend to each other, so it can follow chains (an item is
  on the chain if the item it continues is). Score = ``Linear(LN(item state))``.
* ``independent`` - an MLP on ``[item; query]`` for each item alone: items never see each
  other. The cheap baseline; it cannot follow a chain beyond the first link.

Neither uses absolute position embeddings: an item's position enters as its *relative*
position ``position / n`` (``n`` = the example's item count), a feature that means the same
at N and at 4N items, so routers trained at N can be evaluated at 4N (length
generalisation) and can still tell the latest assignment from an earlier one (``stale``).

:func:`transformer_flops` counts multiply-adds x 2 of a transformer forward pass by
formula; each router's :meth:`TokenRouter.flops` uses it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from masklab.priors.attention import Block
from masklab.priors.bias import key_bias
from masklab.util.registry import Registry

TOKEN_ROUTERS: Registry[type["TokenRouter"]] = Registry("token router")
register = TOKEN_ROUTERS.register


def transformer_flops(tokens: int, dim: int, depth: int, mlp_ratio: int = 4) -> int:
    """FLOPs (2 x multiply-adds) of ``depth`` pre-LN blocks on ``tokens`` tokens: per block
    ``2 T (4 D^2 + 2 r D^2)`` for the projections and MLP plus ``4 T^2 D`` for the
    scores and the weighted sum. Embeddings, norms and heads are ignored."""
    per_block = 2 * tokens * (4 + 2 * mlp_ratio) * dim * dim + 4 * tokens * tokens * dim
    return depth * per_block


def relative_position(positions: Tensor, valid: Tensor) -> Tensor:
    """``(B, N, 1)``: ``position / n`` with ``n`` the example's number of valid items."""
    n = valid.sum(1, keepdim=True).clamp(min=1)
    return (positions.float() / n)[..., None]


class TokenRouter(nn.Module):
    """Base class: one method to override, :meth:`score`."""

    name = "base"

    def __init__(self, vocab: int, dim: int = 32, depth: int = 3, heads: int = 4, length_scale: bool = True) -> None:
        super().__init__()
        self.vocab, self.dim, self.depth, self.heads, self.length_scale = vocab, dim, depth, heads, length_scale
        self.sym = nn.Embedding(vocab, dim)
        nn.init.normal_(self.sym.weight, std=0.5)

    def score(self, items: Tensor, query: Tensor, valid: Tensor, positions: Tensor) -> Tensor:
        """``(B, N)`` raw scores (padding may hold anything)."""
        raise NotImplementedError

    def forward(self, items: Tensor, query: Tensor, valid: Tensor, positions: Tensor | None = None) -> Tensor:
        """items ``(B, N, 2)``, query ``(B, 2)``, valid ``(B, N)`` bool, positions ``(B, N)``
        (default ``1..N``) -> scores ``(B, N)`` with ``-inf`` on padding."""
        B, N, _ = items.shape
        if positions is None:
            positions = torch.arange(1, N + 1, device=items.device).expand(B, N)
        return self.score(items, query, valid, positions).masked_fill(~valid, float("-inf"))

    def flops(self, n_items: int) -> int:
        """FLOPs of one forward pass over ``n_items`` items (by formula)."""
        raise NotImplementedError

    def fields(self, items: Tensor, query: Tensor) -> tuple[Tensor, Tensor]:
        """Symbol embeddings of both fields: items ``(B, N, 2D)``, query ``(B, 2D)``."""
        B, N, _ = items.shape
        return self.sym(items).reshape(B, N, 2 * self.dim), self.sym(query).reshape(B, 2 * self.dim)


@register("transformer")
class TransformerRouter(TokenRouter):
    """Items and query as tokens through ``depth`` blocks of the shared attention core.

    ``length_scale``: multiply every query by ``log(n + 1)`` (``n + 1`` visible tokens), so an
    attention pattern learned at N items stays as sharp among 4N (log-n length scaling)."""

    def __init__(self, vocab: int, dim: int = 32, depth: int = 3, heads: int = 4, length_scale: bool = True) -> None:
        super().__init__(vocab, dim, depth, heads, length_scale)
        self.item_in = nn.Linear(2 * dim, dim)
        self.query_in = nn.Linear(2 * dim, dim)
        self.where = nn.Linear(1, dim)  # relative position
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, 1)

    def score(self, items, query, valid, positions):
        it, q = self.fields(items, query)
        x = torch.cat(
            [self.query_in(q)[:, None], self.item_in(it) + self.where(relative_position(positions, valid))], dim=1
        )
        keep = torch.cat([torch.ones_like(valid[:, :1]), valid], dim=1)
        bias = key_bias(keep)  # (B, 1, 1, N+1)
        scale = torch.log(keep.sum(1).float()) if self.length_scale else None  # (B,)
        for block in self.blocks:
            x, _ = block(x, bias, query_scale=scale)
        return self.out(self.ln(x[:, 1:])).squeeze(-1)

    def flops(self, n_items: int) -> int:
        return transformer_flops(n_items + 1, self.dim, self.depth)


@register("independent")
class IndependentRouter(TokenRouter):
    """``MLP([item fields; query fields; relative position])`` per item, ``depth`` hidden layers
    (``heads`` and ``length_scale`` do not apply: there is no attention)."""

    def __init__(self, vocab: int, dim: int = 32, depth: int = 3, heads: int = 4, length_scale: bool = True) -> None:
        super().__init__(vocab, dim, depth, heads, length_scale)
        layers: list[nn.Module] = [nn.Linear(4 * dim + 1, 2 * dim), nn.GELU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(2 * dim, 2 * dim), nn.GELU()]
        self.mlp = nn.Sequential(*layers, nn.Linear(2 * dim, 1))

    def score(self, items, query, valid, positions):
        it, q = self.fields(items, query)
        x = torch.cat([it, q[:, None].expand(-1, it.shape[1], -1), relative_position(positions, valid)], dim=-1)
        return self.mlp(x).squeeze(-1)

    def flops(self, n_items: int) -> int:
        d = self.dim
        return 2 * n_items * (4 * d * 2 * d + (self.depth - 1) * (2 * d) ** 2 + 2 * d)


def build_router(
    name: str, vocab: int, dim: int = 32, depth: int = 3, heads: int = 4, length_scale: bool = True
) -> TokenRouter:
    return TOKEN_ROUTERS[name](vocab, dim, depth, heads, length_scale)
