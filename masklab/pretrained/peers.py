"""The peers, run on the same model and the same prompts as masklab.

* ContextCite (``context-cite==0.0.4``, MadryLab): a sparse linear surrogate fitted to
  the answer's log-probability under random sentence ablations. Made to run offline: its
  import calls ``nltk.download("punkt_tab")`` (a network fetch), which we turn into a
  no-op, and the context is given already split into our sentences through a
  :class:`BaseContextPartitioner` subclass, so its nltk sentence splitter is never used.
  The prompt is formatted as masklab formats it (:func:`masklab.pretrained.lm.prompt_parts`,
  raw or chat turns): a template that only passes the text through (plus BOS) is set
  while ContextCite runs.
* kvpress (``kvpress==0.5.5``, NVIDIA): KV-cache presses that drop a fraction of the
  context's keys/values at pre-fill, through kvpress's own
  ``kv-press-text-generation`` pipeline. SnapKV's observation window defaults to 64
  query tokens, longer than the question of a short prompt; we use
  ``SNAPKV_WINDOW`` = 8.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

from masklab.pretrained.models import PRETRAINED_EXTRA, LoadedModel, _require

PLAIN_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
SNAPKV_WINDOW = 8


@contextlib.contextmanager
def _chat_template(tokenizer, template: str | None):
    old = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        yield
    finally:
        tokenizer.chat_template = old


def _import_context_cite():
    _require("context_cite", PRETRAINED_EXTRA)
    import nltk

    real = nltk.download
    nltk.download = lambda *a, **k: False  # offline: ContextCite fetches punkt_tab at import
    try:
        import context_cite
        from context_cite.context_partitioner import BaseContextPartitioner
    finally:
        nltk.download = real
    return context_cite, BaseContextPartitioner


def presplit_partitioner(sentences: list[str]):
    """A ContextCite partitioner over sentences we already split (joined by one space)."""
    _, Base = _import_context_cite()
    import numpy as np

    class PresplitPartitioner(Base):
        def __init__(self, parts: list[str]):
            super().__init__(" ".join(parts))
            self.parts = list(parts)

        @property
        def num_sources(self) -> int:
            return len(self.parts)

        def split_context(self) -> None:  # already split
            return None

        def get_source(self, index: int) -> str:
            return self.parts[index]

        def get_context(self, mask=None) -> str:
            keep = np.ones(len(self.parts), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
            return " ".join(p for p, k in zip(self.parts, keep) if k)

    return PresplitPartitioner(sentences)


def contextcite_scores(lm: LoadedModel, sentences: list[str], query: str, ablations: int = 32,
                       max_new_tokens: int = 8, seed: int = 0) -> dict:
    """ContextCite attributions of ``lm``'s answer (the scored head of its continuation)
    to each sentence. Returns ``{"answer", "scores" (N floats), "forward_passes"}``."""
    import numpy as np
    import torch

    from masklab.tasks.stale_prompts import answer_head

    from masklab.pretrained.lm import prompt_parts

    cc, _ = _import_context_cite()
    np.random.seed(seed)  # ContextCite draws its ablation masks with numpy's global RNG
    torch.manual_seed(seed)
    part = presplit_partitioner(sentences)
    tok = lm.tokenizer
    side = tok.padding_side
    tok.padding_side = "left"
    before, after = prompt_parts(lm, query)
    template = before.replace("{", "{{").replace("}", "}}") + "{context}" + after.replace("{", "{{").replace("}", "}}")
    plain = PLAIN_TEMPLATE
    if before and tok.bos_token and before.startswith(tok.bos_token):
        plain = PLAIN_TEMPLATE.replace("{{ bos_token }}", "")
    try:
        with _chat_template(tok, plain):
            citer = cc.ContextCiter(lm.model, tok, part.context, query, partitioner=part,
                                    prompt_template=template, num_ablations=ablations,
                                    generate_kwargs={"max_new_tokens": max_new_tokens, "do_sample": False},
                                    batch_size=1)
            citer.logger.setLevel("ERROR")
            response = citer.response
            head = answer_head(response)
            start = response.find(head) if head else -1
            if start < 0:
                scores = citer.get_attributions(verbose=False)
            else:
                scores = citer.get_attributions(start_idx=start, end_idx=start + len(head), verbose=False)
    finally:
        tok.padding_side = side
    return {"answer": head, "scores": [float(s) for s in scores], "forward_passes": ablations + 1}


# --------------------------------------------------------------------------- kvpress
def _presses() -> dict[str, Callable[[float], object]]:
    _require("kvpress", PRETRAINED_EXTRA)
    import kvpress as kp

    return {
        "snapkv": lambda r: kp.SnapKVPress(compression_ratio=r, window_size=SNAPKV_WINDOW),
        "knorm": lambda r: kp.KnormPress(compression_ratio=r),
        "tova": lambda r: kp.TOVAPress(compression_ratio=r),
        "streaming": lambda r: kp.StreamingLLMPress(compression_ratio=r),
        "expected-attention": lambda r: kp.ExpectedAttentionPress(compression_ratio=r),
    }


PRESS_NAMES = ("snapkv", "knorm", "tova", "streaming", "expected-attention")
ADAKV_PREFIX = "adakv-"  # ``adakv-<press>``: the scorer press wrapped in kvpress's AdaKVPress (head-wise budgets)


def press_names() -> list[str]:
    """Every press :class:`KVPressRunner` runs: the plain ones and their AdaKV wrappings
    (not StreamingLLM, whose fixed sink + window scores leave AdaKV nothing to adapt)."""
    return list(PRESS_NAMES) + [ADAKV_PREFIX + p for p in PRESS_NAMES if p != "streaming"]


def make_press(name: str, keep: float):
    """A kvpress press keeping ``keep`` of the context's KV pairs (compression ratio
    ``1 - keep``, clipped to [0, 0.99]). AdaKV masks the dropped pairs per head instead
    of removing them from the cache."""
    from masklab.errors import MasklabError

    factories = _presses()
    if name not in press_names():
        raise MasklabError(f"unknown press {name!r}: use one of {', '.join(press_names())}")
    ratio = max(0.0, min(0.99, 1.0 - keep))
    if name.startswith(ADAKV_PREFIX):
        import kvpress as kp

        return kp.AdaKVPress(factories[name[len(ADAKV_PREFIX):]](ratio))
    return factories[name](ratio)


class KVPressRunner:
    """kvpress's own pipeline over a loaded model; ``answer(context, question, answer_prefix,
    press, keep)`` returns the greedy answer text with ``1 - keep`` of the context's KV
    pairs dropped by the press (``press=None``: full context). After each answer,
    ``last_cache_tokens`` is the number of context positions left in the KV cache after
    pre-fill (layer 0): the context length without a press, about ``keep`` of it with one."""

    def __init__(self, lm: LoadedModel):
        _require("kvpress", PRETRAINED_EXTRA)
        import kvpress  # noqa: F401  (registers the pipeline)
        from transformers import pipeline

        import logging

        logging.getLogger("kvpress").setLevel(logging.ERROR)  # "Gemma3ForCausalLM not tested" on every call
        self.lm = lm
        self.pipe = pipeline("kv-press-text-generation", model=lm.model, tokenizer=lm.tokenizer, device="cpu")
        self.last_cache_tokens: int | None = None

    def answer(self, context: str, question: str, answer_prefix: str, press, keep: float,
               max_new_tokens: int = 6) -> tuple[str, float]:
        """``question`` and ``answer_prefix`` are joined by a line break (kvpress's format
        for a model without a chat template) in the raw prompt format; in the chat format
        a one-turn template puts the context and question in the user turn and the prefix
        in the assistant turn, as :func:`masklab.pretrained.lm.encode` does. ``press``: a name (:func:`press_names`), a kvpress press object (``keep`` then
        unused) or None. Returns ``(text, seconds)``; ``last_cache_tokens`` holds the KV
        cache's length after the call."""
        from transformers import DynamicCache

        obj = make_press(press, keep) if isinstance(press, str) else press
        from masklab.pretrained.lm import chat_template

        cache = DynamicCache()  # ours, so the pressed length can be read back (the pipeline removes the answer from it)
        t0 = time.perf_counter()
        with _chat_template(self.lm.tokenizer, chat_template(self.lm)):
            out = self.pipe(context, question=question, answer_prefix=answer_prefix, press=obj,
                            max_new_tokens=max_new_tokens, cache=cache)
        seconds = time.perf_counter() - t0
        self.last_cache_tokens = int(cache.get_seq_length())
        return out["answer"], seconds
