"""A Vision Transformer on the shared attention core (read top to bottom).

images ``(B, C, S, S)`` -> non-overlapping ``patch x patch`` patches, flattened and
linearly embedded ``(B, P, D)`` with ``P = (S / patch)**2`` -> prepend CLS, add learned
positions ``(B, T, D)``, ``T = P + 1`` -> ``depth`` Blocks (each with an optional prior,
e.g. a 2-D locality :class:`~masklab.priors.bias.MaskPrior`) -> LayerNorm -> linear head on CLS
-> logits ``(B, classes)``.

Token order is CLS first, then patches row by row (what :mod:`masklab.priors.structures`'
2-D builders assume). :data:`PRESETS` names consistent sizes (timm style): ``vit-tiny`` is
the paper's ViT-Tiny width/depth/heads for GPU users; the ``cpu-*`` presets are small
enough to train on a laptop CPU in minutes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from masklab.models.encoder import CLSEncoder
from masklab.priors.attention import Block

#: name -> (patch, dim, depth, heads). Image size and classes come from the data set.
PRESETS: dict[str, dict[str, int]] = {
    "vit-tiny": {"patch": 4, "dim": 192, "depth": 12, "heads": 3},  # ViT-Tiny on 32x32 (GPU)
    "vit-small-cpu": {"patch": 4, "dim": 96, "depth": 6, "heads": 4},  # CIFAR on a CPU (hours)
    "cpu-digits": {"patch": 2, "dim": 64, "depth": 4, "heads": 4},  # digits 8x8: 16 patches
    "cpu-micro": {"patch": 2, "dim": 32, "depth": 2, "heads": 4},  # tests and --quick
}


class ViT(CLSEncoder):
    """Args:
    image_size: side ``S`` of the square input images.
    patch: patch side (``S`` must be divisible by it).
    channels: input channels ``C``.
    classes: number of output classes.
    dim, depth, heads: width, number of blocks, heads per block.
    priors: one optional prior module per block (called as ``prior(T)``).
    mlp_ratio: MLP hidden width as a multiple of ``dim``.
    """

    def __init__(
        self,
        image_size: int,
        patch: int,
        channels: int,
        classes: int,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        priors: list[nn.Module | None] | None = None,
        mlp_ratio: int = 4,
    ) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image size {image_size} is not divisible by patch size {patch}")
        priors = priors or [None] * depth
        if len(priors) != depth:
            raise ValueError(f"need one prior per block: got {len(priors)} for depth {depth}")
        self.image_size, self.patch, self.channels = image_size, patch, channels
        self.grid = image_size // patch
        self.dim, self.depth, self.heads = dim, depth, heads
        self.patch_embed = nn.Linear(channels * patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(dim))
        self.pos = nn.Parameter(torch.randn(self.grid * self.grid + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, p, mlp_ratio * dim) for p in priors)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    @property
    def seq_len(self) -> int:
        """``T = grid**2 + 1`` tokens (CLS + patches)."""
        return self.grid * self.grid + 1

    def patchify(self, images: Tensor) -> Tensor:
        """``(B, C, S, S)`` -> ``(B, P, C * patch * patch)``, patches row by row."""
        B, C, S, _ = images.shape
        p, g = self.patch, self.grid
        x = images.reshape(B, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5)  # (B, g, g, C, p, p)
        return x.reshape(B, g * g, C * p * p)

    def embed(self, images: Tensor) -> Tensor:
        """images ``(B, C, S, S)`` -> block input ``(B, T, D)`` with CLS at position 0."""
        if images.shape[1:] != (self.channels, self.image_size, self.image_size):
            raise ValueError(
                f"expected images (B, {self.channels}, {self.image_size}, {self.image_size}), got {tuple(images.shape)}"
            )
        x = self.patch_embed(self.patchify(images))
        cls = self.cls.expand(x.shape[0], 1, -1)
        return torch.cat([cls, x], dim=1) + self.pos
