"""Evidence reader: a transformer whose context is split into items, one token per item.

    items (B, N, 2), query (B, 2)
      -> item token  = W_item [E(f0); E(f1)] + pos(position)        (one token per item)
      -> query token = W_query [E(q0); E(q1)] + pos(0)              (at sequence index 0)
      -> depth Blocks of the shared attention core, keys restricted by key_bias(visible)
      -> LayerNorm -> linear head on the query token -> dot with E -> logits (B, vocab)

One token per item (the two symbols' embeddings concatenated) is deliberate: a first
prototype with two tokens per pointer fact stalled near 30% on 2-3 hop chains. Items carry
their own position ids, so hiding an item by deleting its token keeps every other item's
position (and gives the same function as blocking its key in the bias).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from masklab.priors.attention import Block
from masklab.priors.bias import key_bias


class EvidenceReader(nn.Module):
    """Args:
    vocab: number of symbols (answers are symbols too).
    max_items: largest position id an item can have.
    dim, depth, heads: width, number of blocks, heads per block.
    recency: also add ``Linear(position / max_items)`` to every item token, a direction in
        which later items are monotonically "larger" (helps "latest assignment wins").
    """

    def __init__(
        self, vocab: int, max_items: int, dim: int = 64, depth: int = 4, heads: int = 4, recency: bool = False
    ) -> None:
        super().__init__()
        self.vocab, self.max_items, self.dim, self.depth, self.heads = vocab, max_items, dim, depth, heads
        self.recency = nn.Linear(1, dim) if recency else None
        self.sym = nn.Embedding(vocab, dim)
        self.item_in = nn.Linear(2 * dim, dim)
        self.query_in = nn.Linear(2 * dim, dim)
        self.pos = nn.Embedding(max_items + 1, dim)
        nn.init.normal_(self.sym.weight, std=0.5)
        nn.init.normal_(self.pos.weight, std=0.5)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, dim)  # output logits are tied to the symbol embeddings

    def embed(self, items: Tensor, query: Tensor, positions: Tensor) -> Tensor:
        """items ``(B, N, 2)``, query ``(B, 2)``, positions ``(B, N)`` -> ``(B, N + 1, D)``."""
        B, N, _ = items.shape
        it = self.item_in(self.sym(items).reshape(B, N, 2 * self.dim)) + self.pos(positions)
        if self.recency is not None:
            it = it + self.recency(positions[..., None].float() / self.max_items)
        q = self.query_in(self.sym(query).reshape(B, 1, 2 * self.dim)) + self.pos.weight[0]
        return torch.cat([q, it], dim=1)

    def base_bias(self, seq: int, device: torch.device | None = None) -> None:
        """The bias every block always gets: none (bidirectional; visibility comes per call)."""
        return None

    def forward(
        self,
        items: Tensor,
        query: Tensor,
        visible: Tensor,
        positions: Tensor | None = None,
        return_attn: bool = False,
        return_hidden: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        """items ``(B, N, 2)``, query ``(B, 2)``, visible ``(B, N)`` bool (False: padding or a
        hidden item, its key gets ``-inf``), positions ``(B, N)`` (default ``1..N``).

        Returns ``(logits (B, vocab), extras)``: ``extras`` is the per-block attention
        ``[(B, H, N+1, N+1)]`` with ``return_attn``, the per-block query-token states
        ``[(B, D)]`` with ``return_hidden``, else ``[]``.
        """
        B, N, _ = items.shape
        if positions is None:
            positions = torch.arange(1, N + 1, device=items.device).expand(B, N)
        x = self.embed(items, query, positions)
        keep = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=items.device), visible], dim=1)
        bias = key_bias(keep)  # (B, 1, 1, N+1): the query token is always visible
        extras = []
        for block in self.blocks:
            x, probs = block(x, bias, return_attn)
            if probs is not None:
                extras.append(probs)
            elif return_hidden:
                extras.append(x[:, 0])
        return self.answer_from(x[:, 0]), extras

    def answer_from(self, state: Tensor) -> Tensor:
        """Logits ``(B, vocab)`` read from a query-token state ``(B, D)`` (also auxiliary probes).
        The output is tied to the symbol embeddings, so copying a symbol is easy to learn."""
        return self.head(self.ln(state)) @ self.sym.weight.T
