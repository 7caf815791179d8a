"""User text in: context files and questions, checked once with one clear message each.

Every command that reads a user's document (``compress``, ``cite``) goes through
:func:`read_text` and :func:`check_question`, so a binary file, a Latin-1 file, an empty
file, a file too large to tokenise quickly, or an empty question is one
``masklab: error: ...`` line (exit 2) before any model is loaded. ``compress`` reads
several passages through :func:`read_passages` (files, a folder, a JSON list of strings).
"""

from __future__ import annotations

import codecs
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from masklab.util.errors import MasklabError

MAX_CONTEXT_BYTES = 1_000_000  # ~250k tokens of English: far past any packaged model's window
BINARY_SNIFF = 8192  # bytes looked at for NUL bytes
# byte-order marks that say the text is UTF-16 or UTF-32 (whose NUL bytes are text): longest first
BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def wide_encoding(encoding: str | None, data: bytes) -> str | None:
    """``"utf-16"``/``"utf-32"`` when the text is in one of them: ``encoding`` names one, or
    none is given and ``data`` opens with its byte-order mark; else None."""
    if encoding is not None:
        try:
            name = codecs.lookup(encoding).name
        except LookupError:
            return None
        return name if name.startswith(("utf-16", "utf-32")) else None
    return next((enc for bom, enc in BOMS if data.startswith(bom)), None)


def read_text(
    source: str, encoding: str | None = None, max_bytes: int = MAX_CONTEXT_BYTES, what: str = "context"
) -> str:
    """The text of file ``source`` (``-``: standard input), decoded as ``encoding`` (default
    strict UTF-8, a leading BOM dropped). Raises :class:`MasklabError` for a missing or
    unreadable file, a file larger than ``max_bytes``, binary data (NUL bytes), text that is
    not valid in the encoding, and text that is empty or only whitespace."""
    name = "standard input" if source == "-" else str(source)
    if source == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise MasklabError(f"{what} file {name} does not exist")
        if not path.is_file():
            raise MasklabError(f"{what} file {name} is not a regular file")
        size = path.stat().st_size
        if size > max_bytes:
            raise MasklabError(
                f"{what} file {name} is {size:,} bytes, over the limit of {max_bytes:,} "
                f"(raise it with --max-context-bytes)"
            )
        try:
            data = path.read_bytes()
        except OSError as e:
            raise MasklabError(f"cannot read {what} file {name}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise MasklabError(
            f"{what} on {name} is over the limit of {max_bytes:,} bytes (raise it with --max-context-bytes)"
        )
    wide = wide_encoding(encoding, data)
    if wide is None and b"\x00" in data[:BINARY_SNIFF]:
        raise MasklabError(
            f"{what} file {name} looks binary (it holds NUL bytes); give a text file "
            "(UTF-16 text without a byte-order mark: pass --encoding utf-16-le)"
        )
    enc = encoding or wide or "utf-8-sig"
    try:
        text = data.decode(enc)
    except LookupError:
        raise MasklabError(f"unknown text encoding {encoding!r} (e.g. utf-8, latin-1, cp1252)") from None
    except UnicodeDecodeError as e:
        raise MasklabError(
            f"{what} file {name} is not valid {encoding or 'UTF-8'} text (byte {e.start}: "
            f"{data[e.start : e.start + 1]!r}); convert it or pass --encoding, e.g. --encoding "
            "latin-1"
        ) from None
    text = text.removeprefix("\ufeff")  # a BOM the codec kept (utf-16-le/-be, utf-32-le/-be)
    if "\x00" in text[:BINARY_SNIFF]:
        raise MasklabError(f"{what} file {name} looks binary (it holds NUL characters as {enc}); give a text file")
    if not text.strip():
        raise MasklabError(f"{what} file {name} is empty")
    return text


def check_context(text: str, what: str = "context", max_bytes: float = MAX_CONTEXT_BYTES) -> int:
    """A context given as text (not a file, e.g. in a ``masklab serve`` request), checked as
    :func:`read_text` checks a file: at most ``max_bytes`` in UTF-8, no NUL characters, not
    empty or only whitespace, no lone surrogates (which no UTF-8 text holds). Returns its size
    in UTF-8 bytes (counted once, here)."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise MasklabError(f"{what} is not valid Unicode text (a lone surrogate at character {e.start})") from None
    if size > max_bytes:
        raise MasklabError(f"{what} is {size:,} bytes, over the limit of {max_bytes:,}")
    if "\x00" in text[:BINARY_SNIFF]:
        raise MasklabError(f"{what} looks binary (it holds NUL characters); give text")
    if not text.strip():
        raise MasklabError(f"{what} is empty")
    return size


def looks_binary(path: Path) -> bool:
    """A file whose first bytes hold NUL bytes and no UTF-16/32 byte-order mark."""
    with open(path, "rb") as f:
        head = f.read(BINARY_SNIFF)
    return b"\x00" in head and wide_encoding(None, head) is None


def json_passages(text: str, name: str) -> list[str]:
    """The passages of a JSON list of strings (``text``, read from ``name``), each non-empty."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise MasklabError(
            f"{name} starts with [ but is not a valid JSON list ({e.msg} at line {e.lineno}, "
            f"column {e.colno}); give a JSON list of strings"
        ) from None
    if not isinstance(items, list) or not items:
        raise MasklabError(f"{name} holds no passages: give a non-empty JSON list of strings")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise MasklabError(f"{name}: passage {i} is a JSON {type(item).__name__}, not a string")
        if not item.strip():
            raise MasklabError(f"{name}: passage {i} is empty")
    return items


@dataclass(frozen=True)
class Passages:
    """What ``--context`` read: the ``texts``, each one's ``names`` (its file, ``FILE[i]`` for the
    i-th string of a JSON list, ``-`` for standard input), whether they are ``several`` passages
    (False: one document) and what a folder read ``skipped`` (one line each: subfolders, hidden
    files, binary files)."""

    texts: list[str]
    names: list[str]
    several: bool
    skipped: list[str] = field(default_factory=list)


def read_passages(sources: list[str], encoding: str | None = None, max_bytes: int = MAX_CONTEXT_BYTES) -> Passages:
    """The passages of ``sources`` (:class:`Passages`); one text file or standard input is one
    document, read as :func:`read_text` reads it.

    Each source is a text file; a folder (its files sorted by name; subfolders, hidden and binary
    files skipped, and said so in :attr:`Passages.skipped`); a ``.json`` file, or ``-`` (standard
    input, once), whose text starts with ``[``: a JSON list of strings, one passage each. Several
    sources are several passages, in the order given; together they must stay within ``max_bytes``."""
    if not sources:
        raise MasklabError("--context is required (text files, a folder, a JSON list, or - for standard input)")
    if sources.count("-") > 1:
        raise MasklabError("--context: standard input (-) can be read once")
    texts: list[str] = []
    names: list[str] = []
    skipped: list[str] = []
    several = len(sources) > 1
    for src in sources:
        path = Path(src).expanduser()
        if src != "-" and path.is_dir():
            entries = sorted(path.iterdir())
            hidden = [p for p in entries if p.name.startswith(".")]
            folders = [p for p in entries if p.is_dir() and p not in hidden]
            files = [p for p in entries if p.is_file() and p not in hidden]
            binary = [p for p in files if looks_binary(p)]
            files = [p for p in files if p not in binary]
            for what, paths in (("subfolder", folders), ("hidden file", hidden), ("binary file", binary)):
                if paths:
                    shown = ", ".join(p.name for p in paths[:5]) + (", ..." if len(paths) > 5 else "")
                    plural = what + ("s" if len(paths) > 1 else "")
                    skipped.append(f"{src}: {len(paths)} {plural} not read ({shown})")
            if not files:
                raise MasklabError(f"context folder {src} holds no text files")
            texts += [read_text(str(p), encoding, max_bytes) for p in files]
            names += [str(Path(src) / p.name) for p in files]
            several = True
            continue
        text = read_text(src, encoding, max_bytes)
        if (src == "-" or path.suffix.lower() == ".json") and text.lstrip().startswith("["):
            items = json_passages(text, "standard input" if src == "-" else src)
            texts += items
            names += [f"{src}[{i}]" for i in range(len(items))]
            several = True
        else:
            texts.append(text)
            names.append(src)
    size = sum(len(t.encode("utf-8")) for t in texts)
    if size > max_bytes:
        raise MasklabError(
            f"the passages are {size:,} bytes together, over the limit of {max_bytes:,} "
            "(raise it with --max-context-bytes)"
        )
    return Passages(texts, names, several, skipped)


def check_question(question: str | None, what: str = "question") -> str:
    """``question`` stripped; an empty or whitespace-only one is refused."""
    q = (question or "").strip()
    if not q:
        raise MasklabError(f"the {what} is empty: give the question the context should answer")
    try:
        q.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MasklabError(f"the {what} is not valid Unicode text (a lone surrogate at character {e.start})") from None
    return q


def check_model_paths(names: list[str]) -> None:
    """A ``--model`` that names a directory must hold a Hugging Face model (``config.json``);
    a ``.gguf`` must be a file. Registered names are left to the loader."""
    for name in names:
        path = Path(name).expanduser()
        if path.is_dir() and not (path / "config.json").is_file():
            raise MasklabError(
                f"--model {name}: the directory holds no config.json, so it is not a Hugging Face "
                "model directory (give a registered name, see `masklab models`, a model directory or "
                "a .gguf file)"
            )
        if name.endswith(".gguf") and path.exists() and not path.is_file():
            raise MasklabError(f"--model {name}: not a .gguf file")
