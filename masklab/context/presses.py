"""kvpress's presses: :class:`Press`, their own type beside :class:`~masklab.context.router.Router`.

A press drops ``1 - keep`` of the context's key/value pairs inside the model at prefill,
through kvpress's own ``kv-press-text-generation`` pipeline (:class:`KVPressRunner`); it
keeps no units of the text, so it answers (``masklab compress --router <press> --answer``,
``masklab longctx --compare``) but does not prune text. :data:`PRESSES` names them all
(this file is the one place that lists them). ``adakv-<press>`` wraps a scorer press in
kvpress's AdaKV (head-wise budgets: it masks the dropped pairs instead of removing them).

Question-agnostic presses see only the context at prefill (kvpress's pipeline feeds the
question afterwards). SnapKV's observation window defaults to 64 query tokens, longer than
the question of a short prompt; we use :data:`SNAPKV_WINDOW` = 8 (its last context tokens).

Question-aware presses (:data:`QUESTION_AWARE`) get the question at the end of the context
they prefill, as their papers set them up: ``snapkv-question`` is SnapKV whose observation
window is exactly the question's tokens; ``finch`` is kvpress's FinchPress, which finds the
question after a delimiter token (an unused special token of the vocabulary, so the model's
embeddings are not resized) and scores the context by the question's attention. The
question is then not asked again after prefill (the answer prefix follows it).
"""

from __future__ import annotations

import time
from functools import partial

from masklab.util.errors import MasklabError
from masklab.pretrained.models import PRETRAINED_EXTRA, require
from masklab.text.query import Query
from masklab.util.registry import Registry

SNAPKV_WINDOW = 8


def _kvpress():
    require("kvpress", PRETRAINED_EXTRA)
    import kvpress

    return kvpress


KVPRESS = {  # name -> kvpress press at compression ratio r
    "snapkv": lambda r: _kvpress().SnapKVPress(compression_ratio=r, window_size=SNAPKV_WINDOW),
    "knorm": lambda r: _kvpress().KnormPress(compression_ratio=r),
    "tova": lambda r: _kvpress().TOVAPress(compression_ratio=r),
    "streaming": lambda r: _kvpress().StreamingLLMPress(compression_ratio=r),
    "expected-attention": lambda r: _kvpress().ExpectedAttentionPress(compression_ratio=r),
    "snapkv-question": lambda r: _kvpress().SnapKVPress(compression_ratio=r),  # window: the question, set per call
    "finch": lambda r: _kvpress().FinchPress(compression_ratio=r),
}
QUESTION_AWARE = ("snapkv-question", "finch")
FINCH_DELIMITERS = ("<unused0>", "<file_sep>", "<|reserved_special_token_0|>", "<|finch_sep|>")
ADAKV_PREFIX = "adakv-"


def press_names() -> list[str]:
    """Every press: the plain ones and their AdaKV wrappings (not StreamingLLM, whose fixed
    sink + window scores leave AdaKV nothing to adapt)."""
    return list(KVPRESS) + [ADAKV_PREFIX + p for p in KVPRESS if p not in ("streaming", *QUESTION_AWARE)]


def make_press(name: str, keep: float):
    """The kvpress press ``name`` keeping ``keep`` of the context's KV pairs (compression
    ratio ``1 - keep``, clipped to [0, 0.99])."""
    if name not in press_names():
        raise MasklabError(f"unknown press {name!r}; choose from {', '.join(press_names())}")
    ratio = max(0.0, min(0.99, 1.0 - keep))
    if name.startswith(ADAKV_PREFIX):
        return _kvpress().AdaKVPress(KVPRESS[name[len(ADAKV_PREFIX) :]](ratio))
    return KVPRESS[name](ratio)


class KVPressRunner:
    """kvpress's own pipeline over a loaded model; ``answer(context, question, answer_prefix,
    press, keep)`` returns the greedy answer text with ``1 - keep`` of the context's KV
    pairs dropped by the press (``press=None``: full context)."""

    def __init__(self, lm) -> None:
        import logging

        _kvpress()  # registers the pipeline
        from transformers import pipeline

        logging.getLogger("kvpress").setLevel(logging.ERROR)  # "Gemma3ForCausalLM not tested" on every call
        self.lm = lm
        self.pipe = pipeline("kv-press-text-generation", model=lm.model, tokenizer=lm.tokenizer, device=lm.model.device)

    def answer(
        self,
        context: str,
        question: str,
        answer_prefix: str,
        press,
        keep: float,
        max_new_tokens: int = 6,
        cache=None,
    ) -> tuple[str, float]:
        """``question`` and ``answer_prefix`` are joined by a line break (kvpress's format
        for a model without a chat template) in the raw prompt format; in the chat format
        a one-turn template puts the context and question in the user turn and the prefix
        in the assistant turn, as :func:`masklab.pretrained.lm.encode` does. ``press``: a
        name (:func:`press_names`), a kvpress press object (``keep`` then unused) or None.
        ``cache``: the ``DynamicCache`` to prefill (None: a new one); the pipeline leaves in it the
        context positions the press kept (``cache.get_seq_length()``, what the lab measures).
        Returns ``(text, seconds)``."""
        from transformers import DynamicCache

        from masklab.pretrained.lm import chat_template
        from masklab.pretrained.peers import chat_template_set

        obj = make_press(press, keep) if isinstance(press, str) else press
        if press in QUESTION_AWARE:  # the question ends the prefilled context (module docstring)
            q = question.strip()
            if press == "finch":
                context = context + self.finch_delimiter(obj) + q
            else:
                context = context + "\n" + q
                obj.window_size = len(self.lm.tokenizer(q, add_special_tokens=False)["input_ids"])
            question = ""
        cache = DynamicCache() if cache is None else cache  # the pipeline removes the answer from it
        t0 = time.perf_counter()
        with chat_template_set(self.lm.tokenizer, chat_template(self.lm)):
            out = self.pipe(
                context,
                question=question,
                answer_prefix=answer_prefix,
                press=obj,
                max_new_tokens=max_new_tokens,
                cache=cache,
            )
        seconds = time.perf_counter() - t0
        return out["answer"], seconds

    def finch_delimiter(self, press) -> str:
        """Set FinchPress's delimiter to an unused special token of the vocabulary."""
        vocab = self.lm.tokenizer.get_vocab()
        token = next((t for t in FINCH_DELIMITERS if t in vocab), FINCH_DELIMITERS[-1])
        press.update_model_and_tokenizer(self.lm.model, self.lm.tokenizer, token)
        return token


PRESSES: Registry = Registry("press")


def refuse_press(name: str, instead: str) -> None:
    """The one refusal of a press where pruned text is needed; ``instead``: what to do."""
    raise MasklabError(f"{name} is a KV-cache press: it prunes the model's cache and keeps no text; {instead}")


class Press:
    """A kvpress press by name, for the loaded model ``lm``: :meth:`answer` answers through
    :class:`KVPressRunner`; it prunes no text. ``masks``: it keeps every pair in the cache and
    masks the dropped ones (AdaKV), so the cache is not smaller."""

    def __init__(self, lm, name: str) -> None:
        self.name = name
        if lm is None:
            raise MasklabError(f"the {self.name} press runs inside a language model: give one (--model / model=...)")
        self.lm = lm
        self.masks = self.name.startswith(ADAKV_PREFIX)
        self._runner: KVPressRunner | None = None

    def answer(self, context: str, query: Query, keep: float, max_new_tokens: int = 6, cache=None) -> tuple[str, float]:
        """``(text, seconds)``: the greedy answer to ``query`` after ``context`` with the press at ``keep``
        (``cache``: as :meth:`KVPressRunner.answer` takes it)."""
        if self._runner is None:
            self._runner = KVPressRunner(self.lm)
        return self._runner.answer(
            context, query.question_line, query.answer_line, self.name, keep, max_new_tokens, cache
        )


for _name in press_names():
    PRESSES.register(_name)(partial(Press, name=_name))
