"""Sentence-level causal evidence for a real LM's own answer.

The context is split into sentences (the items). :class:`SentenceOracle` answers the
question of :mod:`masklab.lab.evidence.search`: with only these sentences visible, does the
model's answer still hold? "Holds" means both that greedy decoding still reproduces every
answer token (argmax) and that the answer's log-probability dropped by less than
``tolerance`` nats. Sentences are hidden by masking their tokens' keys (default; one
batched forward pass for all variants of a call), by hiding their keys only in chosen
layers / heads (``hide="layers"`` with ``layers`` / ``heads``, through
:func:`masklab.pretrained.hf.hide`; all layers and heads equals ``"mask"``), or by deleting their text.

:func:`cite` runs one of the evidence searches (``loo``, ``greedy-minimal``,
``group-testing``) or ContextCite on one context and reports forward passes and seconds.
An empty answer (nothing but whitespace, punctuation or special tokens such as the
end-of-sequence token) has no evidence to find: :func:`cite` stops with
:class:`EmptyAnswer` instead of explaining it.
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from masklab.lab.tasks.base import regex_sentences
from masklab.lab.evidence.search import SEARCHES
from masklab.pretrained.lm import Encoded, answer_scores, answer_tokens, context_cache, encode, generate
from masklab.pretrained.models import LoadedModel
from masklab.util.errors import MasklabError
from masklab.text.query import Query
from masklab.text.query import answer_head

HIDES = ("mask", "layers", "delete")


class EmptyAnswer(MasklabError):
    """The model answered nothing, so there is no answer whose evidence could be found."""


def is_empty_answer(text: str) -> bool:
    """True when the scored head of a continuation (special tokens already removed) is empty."""
    return not answer_head(text)


def empty_answer_message(lm: LoadedModel, generated: str) -> str:
    other = "chat" if getattr(lm, "prompt_format", "raw") == "raw" else "raw"
    return (
        f"{lm.name} gave an empty answer ({generated!r}) with prompt format "
        f"{getattr(lm, 'prompt_format', 'raw')!r}, so there is no evidence to find; the prompt format is "
        f"the likely cause: try --prompt-format {other}"
    )


class SentenceOracle:
    """``holds(keep (V, N) bool) -> (V,) bool`` for one (sentences, query) pair.

    On construction the model answers greedily on the full context (``answer``,
    ``answer_ids``, ``full_logp``). Every evaluated variant adds one to ``passes``. With key
    masks and ``reuse_prefix``, the context's keys and values are cached once and a variant
    is read from its first hidden token on (:func:`~masklab.pretrained.lm.answer_scores`).
    """

    def __init__(
        self,
        lm: LoadedModel,
        sentences: list[str],
        query: str,
        hide: str = "mask",
        tolerance: float = 1.0,
        max_new_tokens: int = 8,
        answer_ids: Tensor | None = None,
        layers: list[int] | None = None,
        heads: list[int] | None = None,
        reuse_prefix: bool = True,
    ):
        if hide not in HIDES:
            raise MasklabError(f"unknown hiding method {hide!r}: use one of {', '.join(HIDES)}")
        if hide != "layers" and (layers is not None or heads is not None):
            raise MasklabError("layers / heads apply only to hide='layers'")
        self.lm, self.sentences, self.query, self.hide, self.tolerance = lm, sentences, query, hide, tolerance
        self.layers, self.heads = layers, heads
        self.enc: Encoded = encode(lm, sentences, query)
        self.generated = None
        # key masks: the context's keys and values are kept from the answer's generation (or read
        # once), and each variant is read from its first hidden token on: the same scores, fewer tokens read
        reuse = reuse_prefix and hide == "mask"
        cache = None
        if reuse and answer_ids is None:
            from transformers import DynamicCache

            cache = DynamicCache()
        if answer_ids is None:
            new, text = generate(lm, self.enc.ids, max_new_tokens, stop_at_head=True, cache=cache)
            self.generated = text
            answer_ids = answer_tokens(lm, new, answer_head(text))
        self.answer_ids = answer_ids
        self.answer = lm.tokenizer.decode(answer_ids, skip_special_tokens=True).strip()
        self.prefix = context_cache(lm, self.enc.ids, cache) if reuse else None
        logp, _ = answer_scores(
            lm, self.enc.ids, answer_ids, torch.ones(1, self.enc.ids.numel(), dtype=torch.bool), prefix=self.prefix
        )
        self.full_logp = float(logp[0])
        self.passes = 0

    @property
    def n_items(self) -> int:
        return len(self.sentences)

    def scores(self, keep: Tensor) -> tuple[Tensor, Tensor]:
        """``(logp (V,), greedy (V,))`` of the answer with only ``keep (V, N)`` visible."""
        self.passes += keep.shape[0]
        if self.hide in ("mask", "layers"):
            item = self.enc.item_of_token  # (T,)
            visible = torch.ones(keep.shape[0], item.numel(), dtype=torch.bool)
            in_ctx = item >= 0
            visible[:, in_ctx] = keep[:, item[in_ctx]]
            if self.hide == "layers":
                return answer_scores(
                    self.lm, self.enc.ids, self.answer_ids, visible, layers=self.layers, heads=self.heads, via="hide"
                )
            return answer_scores(self.lm, self.enc.ids, self.answer_ids, visible, prefix=self.prefix)
        out_lp, out_g = [], []
        for row in keep:
            sub = [s for s, k in zip(self.sentences, row.tolist()) if k]
            enc = encode(self.lm, sub, self.query)
            lp, g = answer_scores(self.lm, enc.ids, self.answer_ids, torch.ones(1, enc.ids.numel(), dtype=torch.bool))
            out_lp.append(lp)
            out_g.append(g)
        return torch.cat(out_lp), torch.cat(out_g)

    def __call__(self, keep: Tensor) -> Tensor:
        logp, greedy = self.scores(keep)
        return greedy & (logp >= self.full_logp - self.tolerance)


def cite(
    lm: LoadedModel,
    context: str | list[str],
    query: str,
    method: str = "group-testing",
    hide: str = "mask",
    tolerance: float = 1.0,
    max_new_tokens: int = 8,
    contextcite_ablations: int = 32,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
) -> dict:
    """Evidence sentences of ``lm``'s answer to ``query`` about ``context``.

    ``context``: text (split into sentences without downloads) or a list of sentences.
    Raises :class:`EmptyAnswer` when the model's answer is empty.
    Returns ``{"sentences", "answer", "answer_logprob", "method", "evidence" (indices),
    "scores" (per-sentence, or None), "forward_passes", "seconds"}``.
    """
    sentences = regex_sentences(context) if isinstance(context, str) else list(context)
    if not sentences:
        raise MasklabError("the context has no sentences")
    if not query.startswith("\n"):
        query = Query(query.strip()).text
    t0 = time.perf_counter()
    if method == "contextcite":
        from masklab.pretrained.peers import contextcite_scores

        res = contextcite_scores(lm, sentences, query, ablations=contextcite_ablations, max_new_tokens=max_new_tokens)
        if is_empty_answer(res["answer"]):
            raise EmptyAnswer(empty_answer_message(lm, res["answer"]))
        scores = res["scores"]
        top = max(range(len(scores)), key=lambda i: scores[i])
        return {
            "sentences": sentences,
            "answer": res["answer"],
            "answer_logprob": float("nan"),
            "method": method,
            "evidence": [top] if scores[top] > 0 else [],
            "scores": scores,
            "forward_passes": res["forward_passes"],
            "seconds": time.perf_counter() - t0,
        }
    if method not in SEARCHES:
        raise MasklabError(f"unknown method {method!r}: use one of {', '.join(list(SEARCHES) + ['contextcite'])}")
    oracle = SentenceOracle(
        lm, sentences, query, hide=hide, tolerance=tolerance, max_new_tokens=max_new_tokens, layers=layers, heads=heads
    )
    if is_empty_answer(oracle.generated):
        raise EmptyAnswer(empty_answer_message(lm, oracle.generated))
    scores = None
    if method == "loo":  # keep the per-sentence log-prob drops as scores
        keep = torch.ones(len(sentences), len(sentences), dtype=torch.bool)
        keep[range(len(sentences)), range(len(sentences))] = False
        logp, greedy = oracle.scores(keep)
        ok = greedy & (logp >= oracle.full_logp - tolerance)
        items = [i for i in range(len(sentences)) if not ok[i]]
        scores = [float(oracle.full_logp - v) for v in logp]
        passes = oracle.passes
    else:
        ev = SEARCHES[method].find(oracle, len(sentences))
        items, passes = ev.items, ev.forward_passes
    return {
        "sentences": sentences,
        "answer": oracle.answer,
        "answer_logprob": oracle.full_logp,
        "method": method,
        "evidence": items,
        "scores": scores,
        "forward_passes": passes + 1,
        "seconds": time.perf_counter() - t0,
    }


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
