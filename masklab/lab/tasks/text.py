"""Text corpora and tokenisers for causal language modelling.

==========  ==========================================================================
corpus      source
==========  ==========================================================================
pydoc       the English documentation text shipped with CPython (``pydoc_data.topics``,
            present on every Python install): topics in sorted order, the last 10% of
            the characters are the validation split
wikitext2   ``DATA_DIR/wiki.train.raw`` and ``wiki.valid.raw`` (WikiText-2 *raw*)
tinystories ``DATA_DIR/TinyStoriesV2-GPT4-train.txt`` + ``-valid.txt`` (or the V1 names
            ``TinyStories-train.txt`` + ``TinyStories-valid.txt``); ``max_chars`` caps
            how much of the (2 GB) training file is read
==========  ==========================================================================

Tokenisers: ``byte`` (UTF-8 bytes, vocabulary 256, nothing to train) or ``bpe`` (a
byte-level BPE trained on the training split with the ``tokenizers`` library).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from masklab.util.errors import MasklabError

CORPORA = ("pydoc", "wikitext2", "tinystories")
TOKENIZERS = ("byte", "bpe")
TINYSTORIES_FILES = (
    ("TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt"),
    ("TinyStories-train.txt", "TinyStories-valid.txt"),
)


@dataclass
class Corpus:
    name: str
    train: str
    valid: str


@dataclass
class TokenData:
    """Token ids ``(N,)`` int64 for each split and the vocabulary size."""

    train: Tensor
    valid: Tensor
    vocab: int


def load_pydoc() -> Corpus:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k].strip() for k in sorted(topics))
    cut = int(len(text) * 0.9)
    return Corpus("pydoc", text[:cut], text[cut:])


def _read(path: Path, max_chars: int | None) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(max_chars) if max_chars else f.read()
    except UnicodeDecodeError:
        raise MasklabError(f"{path} is not UTF-8 text") from None
    if not text.strip():
        raise MasklabError(f"{path} is empty")
    return text


def _folder(data_dir: str | Path | None, name: str, expect: str) -> Path:
    if not data_dir:
        raise MasklabError(f"corpus {name} needs --data-dir: a local folder with {expect}")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise MasklabError(f"data directory {path} does not exist; --data-dir must be a folder with {expect}")
    return path


def load_corpus(name: str, data_dir: str | Path | None = None, max_chars: int | None = None) -> Corpus:
    """Load corpus ``name`` (one of :data:`CORPORA`)."""
    if name == "pydoc":
        return load_pydoc()
    if name == "wikitext2":
        expect = "wiki.train.raw and wiki.valid.raw (WikiText-2 raw)"
        path = _folder(data_dir, name, expect)
        files = [path / "wiki.train.raw", path / "wiki.valid.raw"]
    elif name == "tinystories":
        expect = "TinyStoriesV2-GPT4-train.txt and TinyStoriesV2-GPT4-valid.txt"
        path = _folder(data_dir, name, expect)
        found = [(path / a, path / b) for a, b in TINYSTORIES_FILES if (path / a).exists() and (path / b).exists()]
        files = list(found[0]) if found else [path / f for f in TINYSTORIES_FILES[0]]
    else:
        raise MasklabError(f"unknown corpus {name!r}; choose from {', '.join(CORPORA)}")
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise MasklabError(f"{path} is missing {', '.join(missing)}; expected {expect}")
    return Corpus(name, _read(files[0], max_chars), _read(files[1], max_chars))


def tokenize(corpus: Corpus, tokenizer: str = "byte", bpe_vocab: int = 1024) -> TokenData:
    """Encode both splits. ``bpe`` trains a byte-level BPE of ``bpe_vocab`` tokens on the
    training split (deterministic for a given text)."""
    if tokenizer == "byte":
        enc = lambda s: torch.frombuffer(bytearray(s.encode("utf-8")), dtype=torch.uint8).long()  # noqa: E731
        return TokenData(enc(corpus.train), enc(corpus.valid), 256)
    if tokenizer != "bpe":
        raise MasklabError(f"unknown tokenizer {tokenizer!r}; choose from {', '.join(TOKENIZERS)}")
    try:
        from tokenizers import ByteLevelBPETokenizer
    except ImportError:
        raise MasklabError("--tokenizer bpe needs the tokenizers package: pip install tokenizers") from None
    tok = ByteLevelBPETokenizer()
    chunks = [corpus.train[i : i + 100_000] for i in range(0, len(corpus.train), 100_000)]
    tok.train_from_iterator(chunks, vocab_size=bpe_vocab, min_frequency=2, show_progress=False)

    def enc(text: str) -> Tensor:
        ids: list[int] = []
        for i in range(0, len(text), 100_000):
            ids += tok.encode(text[i : i + 100_000]).ids
        return torch.tensor(ids, dtype=torch.int64)

    return TokenData(enc(corpus.train), enc(corpus.valid), tok.get_vocab_size())
