"""A CLS-token transformer encoder on the shared attention core (read top to bottom).

tokens ``(B, n)`` -> embeddings + positions, prepend CLS -> ``depth`` Blocks -> LayerNorm
-> linear head on CLS -> ``(B, out_dim)``. Used for the Boolean tasks (one token per
variable, values {0, 1}). :class:`CLSEncoder` is the part it shares with the ViT
(:mod:`masklab.models.vit`): the blocks, the final LayerNorm and the head on CLS.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from masklab.priors.attention import Block


class CLSEncoder(nn.Module):
    """``embed`` (the subclass's: its input -> ``(B, T, D)`` with CLS at 0) -> ``self.blocks``
    -> ``self.ln`` -> ``self.head`` on CLS; bidirectional (no base bias)."""

    blocks: nn.ModuleList
    ln: nn.LayerNorm
    head: nn.Linear

    def embed(self, inputs: Tensor) -> Tensor:
        raise NotImplementedError

    def base_bias(self, seq: int, device: torch.device | None = None) -> None:
        """The bias every block always gets: none (bidirectional)."""
        return None

    def forward(
        self, inputs: Tensor, bias: Tensor | None = None, return_attn: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """inputs -> ``(out (B, out_dim), [probs (B, H, T, T) per block] or [])``."""
        x = self.embed(inputs)
        attn = []
        for block in self.blocks:
            x, probs = block(x, bias, return_attn)
            if probs is not None:
                attn.append(probs)
        return self.head(self.ln(x[:, 0])), attn


class TokenEncoder(CLSEncoder):
    """Args:
    vocab: number of token values.
    n_tokens: input length ``n`` (the sequence is ``T = n + 1`` with CLS at 0).
    dim, depth, heads: width, number of blocks, heads per block.
    priors: one optional prior module per block (e.g. :class:`~masklab.priors.bias.MaskPrior`).
    out_dim: size of the CLS head's output.
    """

    def __init__(
        self,
        vocab: int,
        n_tokens: int,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        priors: list[nn.Module | None] | None = None,
        out_dim: int = 1,
    ) -> None:
        super().__init__()
        priors = priors or [None] * depth
        if len(priors) != depth:
            raise ValueError(f"need one prior per block: got {len(priors)} for depth {depth}")
        self.n_tokens, self.dim, self.depth, self.heads = n_tokens, dim, depth, heads
        self.tok = nn.Embedding(vocab, dim)
        nn.init.normal_(self.tok.weight, std=0.02)  # same scale as positions, so both are visible at init
        self.pos = nn.Parameter(torch.randn(n_tokens + 1, dim) * 0.02)
        self.cls = nn.Parameter(torch.randn(dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, p) for p in priors)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, out_dim)

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens ``(B, n)`` -> ``(B, n + 1, D)`` with CLS at position 0."""
        x = self.tok(tokens)
        cls = self.cls.expand(x.shape[0], 1, -1)
        return torch.cat([cls, x], dim=1) + self.pos
