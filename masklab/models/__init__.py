"""Models built on the shared attention core."""

from masklab.models.encoder import TokenEncoder

__all__ = ["TokenEncoder"]
