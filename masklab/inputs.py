"""User text in: context files and questions, checked once with one clear message each.

Every command that reads a user's document (``compress``, ``cite``) goes through
:func:`read_text` and :func:`check_question`, so a binary file, a Latin-1 file, an empty
file, a file too large to tokenise quickly, or an empty question is one
``masklab: error: ...`` line (exit 2) before any model is loaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

from masklab.errors import MasklabError

MAX_CONTEXT_BYTES = 1_000_000  # ~250k tokens of English: far past any packaged model's window
BINARY_SNIFF = 8192  # bytes looked at for NUL bytes


def read_text(source: str, encoding: str | None = None, max_bytes: int = MAX_CONTEXT_BYTES, what: str = "context") -> str:
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
            raise MasklabError(f"{what} file {name} is {size:,} bytes, over the limit of {max_bytes:,} "
                               f"(raise it with --max-context-bytes)")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise MasklabError(f"cannot read {what} file {name}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise MasklabError(f"{what} on {name} is over the limit of {max_bytes:,} bytes (raise it with --max-context-bytes)")
    if b"\x00" in data[:BINARY_SNIFF]:
        raise MasklabError(f"{what} file {name} looks binary (it holds NUL bytes); give a text file")
    enc = encoding or "utf-8-sig"
    try:
        text = data.decode(enc)
    except LookupError:
        raise MasklabError(f"unknown text encoding {encoding!r} (e.g. utf-8, latin-1, cp1252)") from None
    except UnicodeDecodeError as e:
        raise MasklabError(f"{what} file {name} is not valid {encoding or 'UTF-8'} text (byte {e.start}: "
                           f"{data[e.start:e.start + 1]!r}); convert it or pass --encoding, e.g. --encoding latin-1") from None
    if not text.strip():
        raise MasklabError(f"{what} file {name} is empty")
    return text


def check_context(text: str, what: str = "context", max_bytes: int = MAX_CONTEXT_BYTES) -> str:
    """A context given as text (not a file, e.g. in a ``masklab serve`` request), checked as
    :func:`read_text` checks a file: at most ``max_bytes`` in UTF-8, no NUL characters, not
    empty or only whitespace, no lone surrogates (which no UTF-8 text holds). Returns ``text``
    unchanged."""
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
    return text


def check_question(question: str | None, what: str = "question") -> str:
    """``question`` stripped; an empty or whitespace-only one is refused."""
    q = (question or "").strip()
    if not q:
        raise MasklabError(f"the {what} is empty: give the question the context should answer")
    return q


def check_model_paths(names: list[str]) -> None:
    """A ``--model`` that names a directory must hold a Hugging Face model (``config.json``);
    a ``.gguf`` must be a file. Registered names are left to the loader."""
    for name in names:
        path = Path(name).expanduser()
        if path.is_dir() and not (path / "config.json").is_file():
            raise MasklabError(f"--model {name}: the directory holds no config.json, so it is not a Hugging Face "
                               "model directory (give a registered name, see `masklab models`, a model directory or a .gguf file)")
        if name.endswith(".gguf") and path.exists() and not path.is_file():
            raise MasklabError(f"--model {name}: not a .gguf file")
