"""Models built on the shared attention core."""

from masklab.models.encoder import TokenEncoder
from masklab.models.gpt import GPT
from masklab.models.reader import EvidenceReader
from masklab.models.vit import PRESETS, ViT

__all__ = ["TokenEncoder", "GPT", "ViT", "PRESETS", "EvidenceReader"]
