"""A context-level kvpress press (kvpress issue #140): drop context sentences *before*
prefill, inside kvpress's own ``kv-press-text-generation`` pipeline.

kvpress's presses prune the KV cache after a full prefill (memory saved while decoding,
prefill time not). :class:`ContextPress` instead removes the tokens of the sentences a
selector does not keep from the prefill's input itself: while the press is active it
holds a forward *pre*-hook on the base model (``model.model``, which kvpress's pipeline
calls for the prefill) that replaces ``input_ids`` by the kept tokens and passes their
original ``position_ids``. Positions keep their gaps, as key masking does in the
evidence labels, so the question that kvpress feeds afterwards at positions from the
un-pruned context length stays consistent with them. Tokens outside the context (BOS,
chat-turn tokens) are always kept. The pipeline tokenises the context itself, so the
selector maps its ids back to sentences (decode, re-encode with offsets, locate the
context: :func:`sentence_selector`).

kvpress sees no question at prefill (its compression is question-agnostic); a router
that needs the question gets it at construction: :func:`evidence_router_press`.

``prefill_tokens`` / ``context_tokens`` record what the last prefill saw.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from masklab.errors import MasklabError
from masklab.pretrained.models import PRETRAINED_EXTRA, LoadedModel, _require

_require("kvpress", PRETRAINED_EXTRA)
from kvpress.presses.base_press import BasePress  # noqa: E402


def sentence_selector(tokenizer, sentences: list[str], keep: list[bool]) -> Callable[[Tensor], Tensor]:
    """``select(input_ids (1, T)) -> keep (T,) bool``: False on the tokens of the sentences
    of ``" ".join(sentences)`` whose ``keep`` is False (a token belongs to the sentence of
    its first non-space character), True elsewhere."""
    if len(keep) != len(sentences):
        raise MasklabError(f"{len(keep)} keep flags for {len(sentences)} sentences")
    context = " ".join(sentences)

    def select(ids: Tensor) -> Tensor:
        text = tokenizer.decode(ids[0], skip_special_tokens=False)
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        if enc["input_ids"] != ids[0].tolist():
            raise MasklabError("the context press cannot map the prefill's tokens back to text "
                               "(decode and re-encode differ)")
        c0 = text.find(context)
        if c0 < 0:
            raise MasklabError("the context press's sentences are not in the prefill's text")
        starts, pos = [], c0
        for s in sentences:
            starts.append(pos)
            pos += len(s) + 1
        out = torch.ones(ids.shape[1], dtype=torch.bool)
        import bisect

        for t, (a, b) in enumerate(enc["offset_mapping"]):
            if b <= a:
                continue
            mid = a
            while mid < b - 1 and text[mid] == " ":
                mid += 1
            if c0 <= mid < c0 + len(context):
                out[t] = keep[bisect.bisect_right(starts, mid) - 1]
        return out

    return select


@dataclass
class ContextPress(BasePress):
    """Prefill only the context tokens ``select`` keeps (module docstring)."""

    select: Callable[[Tensor], Tensor] = None
    prefill_tokens: int | None = field(default=None, init=False)
    context_tokens: int | None = field(default=None, init=False)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys, values  # nothing to drop after prefill: the context was pruned before it

    def _pre_hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None or ids.shape[1] <= 1:
            return None
        keep = self.select(ids)
        kwargs["input_ids"] = ids[:, keep]
        kwargs["position_ids"] = torch.arange(ids.shape[1], device=ids.device)[keep][None]
        self.context_tokens, self.prefill_tokens = int(ids.shape[1]), int(keep.sum())
        return args, kwargs

    @contextlib.contextmanager
    def __call__(self, model):
        base = model.model.language_model if hasattr(model.model, "language_model") else model.model
        hook = base.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        try:
            yield
        finally:
            hook.remove()


def evidence_router_press(lm: LoadedModel, router, sentences: list[str], question: str, keep: float,
                          layers: int | None = None, fill: bool = False) -> ContextPress:
    """The evidence router (:mod:`masklab.pretrained.lcrouter`) as a kvpress press: it reads
    ``question + context`` through the LM's first layers, keeps the top sentences within
    ``keep`` of the context's tokens (:func:`~masklab.pretrained.lcrouter.keep_by_scores`,
    ``fill`` as there), and the pipeline prefills only those."""
    from masklab.pretrained.lcrouter import ROUTER_LAYERS, early_features, keep_by_scores
    from masklab.tasks.longctx import count_tokens

    lengths = [count_tokens(lm.tokenizer, (" " if i else "") + s) for i, s in enumerate(sentences)]
    scores = router.score(early_features(lm, sentences, question, layers or ROUTER_LAYERS))
    return ContextPress(select=sentence_selector(lm.tokenizer, sentences, keep_by_scores(scores, lengths, keep, fill=fill)))
