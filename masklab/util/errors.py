"""The one error type meant for the user.

``masklab`` prints a :class:`MasklabError` as ``masklab: error: MESSAGE`` and exits with
status 2 (the same as argparse's own usage errors). This module imports nothing from
masklab, so any module may import it without creating an import cycle.
"""

from __future__ import annotations

from collections.abc import Iterable


class MasklabError(Exception):
    """An error with a message meant for the user (bad input, missing package, NaN loss)."""


def unknown(kind: str, name: object, choices: Iterable[str], extra: str = "") -> MasklabError:
    """``unknown KIND 'NAME'; choose from a, b, c[EXTRA]`` (returned, for ``raise``)."""
    return MasklabError(f"unknown {kind} {name!r}; choose from {', '.join(choices)}{extra}")


def check_choices(kind: str, names: Iterable[object], choices: Iterable[str]) -> None:
    """Raise :func:`unknown` for the first of ``names`` that is not one of ``choices``."""
    choices = list(choices)
    for name in names:
        if name not in choices:
            raise unknown(kind, name, choices)
