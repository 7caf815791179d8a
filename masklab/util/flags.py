"""Command-line flags declared once, on the fields of a study's config dataclass.

    @dataclass
    class Config:
        tasks: list[str] = flag(factory=lambda: ["2parity"], name="--task", help="comma-separated tasks")
        steps: int = flag(1500, help="training steps")
        allowed: float = flag(6.0, name="--strength", parse=strength, apply=set_strength, help="...")
        suppressed: float = 6.0   # no flag of its own (--strength sets it)

:func:`add_flags` adds one argparse option per declared flag: ``--field-name`` unless
``name`` says otherwise, a help line ending in the field's default (none for an empty text),
``choices`` and a ``metavar``. :func:`config_from_args` turns the parsed options into a config: a flag that
was not given leaves the *base* config (the study's quick or default config) untouched.

Values: ``int``/``float``/``str`` fields are converted by argparse (a bad number is an
argparse usage error, exit 2); ``bool`` fields get ``--x/--no-x``; list fields
(``list[str]``, ``list[int]``, ``list[float]``) take comma-separated items, and any field
may give its own ``parse(text) -> value``. Those run after argparse, so a bad value
raises :class:`~masklab.util.errors.MasklabError` (``masklab: error: ...``, exit 2).
``apply(value, base, updates) -> {field: value}`` lets one flag set other fields (or
several, as ``--strength a,b`` sets ``allowed`` and ``suppressed``); by default the flag
sets its own field.

Ranges: ``min=`` / ``max=`` (inclusive) and ``above=`` / ``below=`` (exclusive) declare the
values a number (or every item of a number list) may take, e.g. ``flag(200, min=1, help=...)``
or a fraction ``flag(0.5, above=0, max=1, help=...)``. ``--help`` shows the range, and
:func:`check_ranges` (run by the CLI on every study's config before anything starts, and by
studies' ``validate``) refuses a value outside it: ``--steps must be >= 1, got 0``. ``None``
(an unset optional) is always allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass
from typing import Any

from masklab.util.errors import MasklabError


# ----------------------------------------------------------------------------- parsers


def str_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [t.strip() for t in text.split(",") if t.strip()]


def int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in str_list(text)]
    except ValueError:
        raise MasklabError(f"expected comma-separated integers, got {text!r}") from None


def float_list(text: str) -> list[float]:
    try:
        return [float(t) for t in str_list(text)]
    except ValueError:
        raise MasklabError(f"expected comma-separated numbers, got {text!r}") from None


def list_or_none(text: str) -> list[str]:
    """Comma-separated names, or ``none`` for the empty list."""
    return [] if text == "none" else str_list(text)


def strength(text: str) -> tuple[float, float]:
    """``--strength a`` or ``a,b`` (both positive) -> ``(allowed, suppressed)``."""
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        vals = []
    if len(vals) not in (1, 2) or min(vals) <= 0:
        raise MasklabError("--strength takes one or two positive numbers, e.g. 6 or 4,8")
    return vals[0], vals[-1]


def set_strength(value: tuple[float, float], base: Any, updates: dict) -> dict:
    return {"allowed": value[0], "suppressed": value[1]}


def strength_flag(default: float = 6.0) -> Any:
    """The ``allowed`` field of a study with mask priors; ``--strength`` also sets ``suppressed``."""
    return flag(
        default,
        name="--strength",
        parse=strength,
        apply=set_strength,
        metavar="A[,B]",
        help="prior strengths: M = +A where allowed, -B where suppressed (B = A when not given)",
    )


_PARSERS: dict[str, Callable[[str], Any]] = {"list[str]": str_list, "list[int]": int_list, "list[float]": float_list}
_SCALARS: dict[str, type] = {"int": int, "float": float, "str": str}
_METAVARS = {"int": "N", "float": "X", "list[int]": "N,...", "list[float]": "X,...", "list[str]": "A,..."}


# ----------------------------------------------------------------------------- declaring


@dataclass(frozen=True)
class Flag:
    """One command-line option of a config field (see the module docstring)."""

    help: str
    name: str | None = None
    parse: Callable[[str], Any] | None = None
    choices: Sequence[str] | None = None
    metavar: str | None = None
    apply: Callable[[Any, Any, dict], dict] | None = None
    default_text: str | None = None  # shown instead of the field's default (e.g. for None)
    min: float | None = None  # inclusive bounds of a number (of every item of a list)
    max: float | None = None
    above: float | None = None  # exclusive bounds
    below: float | None = None

    def range_text(self) -> str:
        """``>= 1``, ``in (0, 1]``, ... ('' when unbounded)."""
        lo = (
            f"[{_num(self.min)}" if self.min is not None else f"({_num(self.above)}" if self.above is not None else None
        )
        hi = (
            f"{_num(self.max)}]" if self.max is not None else f"{_num(self.below)})" if self.below is not None else None
        )
        if lo and hi:
            return f"in {lo}, {hi}"
        if lo:
            return (">= " if lo[0] == "[" else "> ") + lo[1:]
        if hi:
            return ("<= " if hi[-1] == "]" else "< ") + hi[:-1]
        return ""

    def allows(self, x: Any) -> bool:
        if isinstance(x, float) and x != x:  # NaN is in no range
            return False
        return not (
            (self.min is not None and x < self.min)
            or (self.max is not None and x > self.max)
            or (self.above is not None and x <= self.above)
            or (self.below is not None and x >= self.below)
        )


def flag(
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | Any = MISSING,
    help: str,
    name: str | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: Sequence[str] | None = None,
    metavar: str | None = None,
    apply: Callable[[Any, Any, dict], dict] | None = None,
    default_text: str | None = None,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    more: Sequence[Flag] = (),
) -> Any:
    """A dataclass field with a command-line flag (``more``: further flags on the same field);
    ``min``/``max`` (inclusive), ``above``/``below`` (exclusive): the allowed range of a number."""
    first = Flag(help, name, parse, choices, metavar, apply, default_text, min, max, above, below)
    return dataclasses.field(default=default, default_factory=factory, metadata={"flags": (first, *more)})


def flags_of(cls: type) -> list[tuple[dataclasses.Field, Flag]]:
    """Every (field, flag) of a config class, in declaration order."""
    return [(f, fl) for f in dataclasses.fields(cls) for fl in f.metadata.get("flags", ())]


def _type(f: dataclasses.Field) -> str:
    """The field's type as text, without ``| None``."""
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return t.replace(" | None", "").replace("None | ", "")


def _option(f: dataclasses.Field, fl: Flag) -> str:
    return fl.name or "--" + f.name.replace("_", "-")


def _dest(f: dataclasses.Field, fl: Flag) -> str:
    return _option(f, fl)[2:].replace("-", "_")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "none"
    return "none" if value is None else str(value)


# ----------------------------------------------------------------------------- argparse


def add_flags(ap: argparse.ArgumentParser, cls: type) -> None:
    """Add the flags of config class ``cls`` to ``ap``; each help line ends with the default."""
    defaults = cls()
    for f, fl in flags_of(cls):
        t = _type(f)
        shown = fl.default_text if fl.default_text is not None else _show(getattr(defaults, f.name))
        said = [f"default {shown}"] if shown else []  # an empty default (a required text) is not shown
        said += [fl.range_text()] if fl.range_text() else []
        tail = f" ({'; '.join(said)})" if said else ""
        kw: dict[str, Any] = {"help": f"{fl.help}{tail}".replace("%", "%%"), "dest": _dest(f, fl)}
        if fl.choices is not None:
            kw["choices"] = list(fl.choices)
        if t == "bool" and fl.parse is None:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            if fl.parse is None and t in _SCALARS:
                kw["type"] = _SCALARS[t]
            elif fl.parse is None and t not in _PARSERS:
                raise TypeError(f"flag {_option(f, fl)} of {cls.__name__}: no parser for type {t}; give parse=")
            if fl.choices is None:
                kw["metavar"] = fl.metavar or _METAVARS.get(t, "TEXT")
        ap.add_argument(_option(f, fl), default=None, **kw)


def config_from_args(args: argparse.Namespace, base: Any) -> Any:
    """``base`` with every flag that was given applied (in declaration order)."""
    updates: dict[str, Any] = {}
    for f, fl in flags_of(type(base)):
        raw = getattr(args, _dest(f, fl), None)
        if raw is None:
            continue
        parse = fl.parse or _PARSERS.get(_type(f))
        try:
            value = parse(raw) if parse is not None and isinstance(raw, str) else raw
        except ValueError:
            raise MasklabError(f"{_option(f, fl)}: invalid value {raw!r}") from None
        updates.update(fl.apply(value, base, updates) if fl.apply else {f.name: value})
    return dataclasses.replace(base, **updates)


def check_ranges(cfg: Any) -> None:
    """Refuse (one :class:`MasklabError`) the first flag value of config ``cfg`` outside the
    range its flag declares: ``--steps must be >= 1, got 0``."""
    for f, fl in flags_of(type(cfg)):
        if not fl.range_text():
            continue
        value = getattr(cfg, f.name)
        items = value if isinstance(value, (list, tuple)) else [value]
        for x in items:
            if x is None or isinstance(x, str) or isinstance(x, bool):
                continue
            if not fl.allows(x):
                raise MasklabError(
                    f"{_option(f, fl)} must be {fl.range_text()}, got {_num(x) if isinstance(x, (int, float)) else x}"
                )
