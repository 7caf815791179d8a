"""Models built on the shared attention core, and the one weight-decay rule they share."""

from masklab.models.encoder import TokenEncoder
from masklab.models.gpt import GPT
from masklab.models.optim import param_groups
from masklab.models.reader import EvidenceReader
from masklab.models.vit import PRESETS, ViT

__all__ = ["TokenEncoder", "GPT", "ViT", "PRESETS", "EvidenceReader", "param_groups"]
