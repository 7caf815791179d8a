"""A GPT-style causal decoder on the shared attention core (read top to bottom).

tokens ``(B, T)`` -> token embeddings (+ learned absolute positions unless
``positions=False``) -> ``depth`` Blocks with the causal bias (plus each block's optional
prior, e.g. a relative-distance or digit-alignment :class:`~masklab.priors.bias.MaskPrior`) ->
LayerNorm -> tied LM head -> logits ``(B, T, vocab)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from masklab.priors.attention import Block
from masklab.priors.bias import causal_bias


class GPT(nn.Module):
    """Args:
    vocab: vocabulary size.
    block_size: longest sequence ``T`` the model reads.
    dim, depth, heads: width, number of blocks, heads per block.
    priors: one optional prior module per block (called as ``prior(T)``).
    positions: learned absolute position embeddings (turn off when a prior or ALiBi
        carries position).
    """

    def __init__(
        self,
        vocab: int,
        block_size: int,
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        priors: list[nn.Module | None] | None = None,
        positions: bool = True,
    ) -> None:
        super().__init__()
        priors = priors or [None] * depth
        if len(priors) != depth:
            raise ValueError(f"need one prior per block: got {len(priors)} for depth {depth}")
        self.block_size = block_size
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(block_size, dim) * 0.02) if positions else None
        self.blocks = nn.ModuleList(Block(dim, heads, p) for p in priors)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying
        nn.init.normal_(self.tok.weight, std=0.02)

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens ``(B, T)`` -> block input ``(B, T, D)``."""
        T = tokens.shape[1]
        if T > self.block_size:
            raise ValueError(f"sequence of length {T} exceeds block_size {self.block_size}")
        x = self.tok(tokens)
        return x if self.pos is None else x + self.pos[:T]

    def base_bias(self, seq: int, device: torch.device | None = None) -> Tensor:
        """The bias every block always gets: causal, ``(seq, seq)``."""
        return causal_bias(seq, device)

    def forward(
        self, tokens: Tensor, bias: Tensor | None = None, return_attn: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """tokens ``(B, T)``; bias: extra additive ``(B|1, H|1, T, T)`` on top of the causal
        mask. Returns ``(logits (B, T, vocab), [probs (B, H, T, T) per block] or [])``."""
        x = self.embed(tokens)
        mask = self.base_bias(tokens.shape[1], tokens.device)
        if bias is not None:
            mask = mask + bias
        attn = []
        for block in self.blocks:
            x, probs = block(x, mask, return_attn)
            if probs is not None:
                attn.append(probs)
        return self.head(self.ln(x)), attn

    def loss(self, tokens: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
        """Cross-entropy of next-token logits: tokens, targets ``(B, T)``."""
        logits, _ = self(tokens)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index)

    @torch.no_grad()
    def generate(self, prompt: Tensor, new_tokens: int) -> Tensor:
        """Greedy decoding: prompt ``(B, T0)`` -> ``(B, T0 + new_tokens)``."""
        out = prompt
        for _ in range(new_tokens):
            logits, _ = self(out[:, -self.block_size :])
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return out
