"""A read of a long document in slices: ``masklab serve`` opens one around a router's read
(:func:`read_in_slices`), and the embedder that reads the units (:meth:`Embedder.units
<masklab.context.embedder.Embedder.units>`) works a slice at a time inside it, so short requests are
answered between the slices of a long one. Its own module, below the router and the embedder that both
use it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar

# A read of a long document in slices (read_in_slices): the slice size and what runs between two slices.
_SLICES: ContextVar[tuple[int, Callable[[int, int], None]] | None] = ContextVar("masklab_slices", default=None)


@contextmanager
def read_in_slices(size: int, between: Callable[[int, int], None]):
    """Within it, a router's read works at most ``size`` units at a time where it embeds them
    (:meth:`~masklab.context.embedder.Embedder.units`: every router that embeds, through whatever
    model holds the embedder) and calls ``between(done, total)`` after each slice but the last;
    ``masklab serve`` answers short requests there, and an exception ``between`` raises ends the read.
    ``between`` runs with slicing closed: a read it makes is not sliced."""
    token = _SLICES.set((size, between))
    try:
        yield
    finally:
        _SLICES.reset(token)


def slice_size() -> int | None:
    """Units per slice of the open :func:`read_in_slices` (None: read whole)."""
    open_ = _SLICES.get()
    return None if open_ is None else open_[0]


def between_slices(done: int, total: int) -> None:
    """Call the open :func:`read_in_slices`' ``between``, slicing closed while it runs."""
    open_ = _SLICES.get()
    if open_ is None:
        return
    token = _SLICES.set(None)
    try:
        open_[1](done, total)
    finally:
        _SLICES.reset(token)
