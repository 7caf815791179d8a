"""Models built on the shared attention core."""

from masklab.models.encoder import TokenEncoder
from masklab.models.gpt import GPT

__all__ = ["TokenEncoder", "GPT"]
