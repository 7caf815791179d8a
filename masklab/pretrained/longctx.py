"""A real LM on the long-context tasks of :mod:`masklab.tasks.longctx`: answer from the
full context or from kept sentences, the oracle router that keeps the gold sentences, and
causal evidence over sentences by group testing.

Pruning is *before* prefill: the sentences not kept are deleted from the text, so the
prompt the model reads (and its prefill time) shrinks with the kept fraction.
"""

from __future__ import annotations

import random
import re
import resource
import sys
import time

from masklab.pretrained.lm import encode
from masklab.pretrained.models import LoadedModel
from masklab.tasks.longctx import LongExample, count_tokens, score


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (monotone over a run)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024


def sentence_tokens(lm: LoadedModel, ex: LongExample) -> list[int]:
    """Tokens of each context sentence as it sits in the context (with its leading space)."""
    return [count_tokens(lm.tokenizer, (" " if i else "") + s) for i, s in enumerate(ex.sentences)]


def answer(lm: LoadedModel, ex: LongExample, keep: list[bool] | None = None, max_new_tokens: int = 10) -> dict:
    """Greedy answer from the kept sentences (all when ``keep`` is None).

    Returns ``{"generated", "correct", "seconds" (tokenise + prefill + decode),
    "prefill_seconds" (tokenise + prefill), "tokens" (prompt), "new_tokens"}``."""
    import torch

    sentences = ex.sentences if keep is None else [s for s, k in zip(ex.sentences, keep) if k]
    t0 = time.perf_counter()
    enc = encode(lm, sentences, ex.query)
    with torch.no_grad():
        out = lm.model(input_ids=enc.ids[None], use_cache=True, logits_to_keep=1)
        t1 = time.perf_counter()
        eos = lm.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        new: list[int] = []
        for _ in range(max_new_tokens):  # greedy, as generate(do_sample=False) decodes
            nxt = int(out.logits[0, -1].argmax())
            new.append(nxt)
            if nxt in eos or len(new) == max_new_tokens:
                break
            out = lm.model(input_ids=torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    text = lm.tokenizer.decode(new, skip_special_tokens=True)
    return {"generated": text, "correct": score(text, ex), "seconds": time.perf_counter() - t0,
            "prefill_seconds": t1 - t0, "tokens": int(enc.ids.numel()), "new_tokens": len(new)}


def kv_cache_mb(lm: LoadedModel, tokens: float) -> float:
    """KV-cache size by formula for ``tokens`` cached positions: layers x 2 (K, V) x KV heads
    x head dim x tokens x bytes per value, in MiB (every layer full length: Gemma 3's
    sliding-window layers would cap theirs at the window)."""
    c = lm.model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    size = next(lm.model.parameters()).element_size()
    return c.num_hidden_layers * 2 * kv_heads * head_dim * tokens * size / 2**20


def oracle_gold_keep(ex: LongExample, lengths: list[int], keep: float, seed: int = 0) -> list[bool]:
    """The oracle router: every gold sentence, then other sentences in a seeded random order
    while the kept tokens stay within ``keep`` of the context's (gold is kept even if it
    alone exceeds the budget)."""
    budget = keep * sum(lengths)
    out = [False] * len(ex.sentences)
    used = 0
    for g in ex.gold:
        out[g] = True
        used += lengths[g]
    others = [i for i in range(len(ex.sentences)) if i not in set(ex.gold)]
    random.Random(seed).shuffle(others)
    for i in others:
        if used + lengths[i] <= budget:
            out[i] = True
            used += lengths[i]
    return out


def chunk_sentences(lengths: list[int], chunk_tokens: int | None) -> list[list[int]]:
    """Consecutive sentences grouped into chunks of at most ``chunk_tokens`` tokens (a longer
    sentence is a chunk alone); None: one chunk per sentence. Returns sentence indices."""
    if chunk_tokens is None:
        return [[i] for i in range(len(lengths))]
    chunks: list[list[int]] = []
    used = 0
    for i, n in enumerate(lengths):
        if chunks and used + n <= chunk_tokens:
            chunks[-1].append(i)
            used += n
        else:
            chunks.append([i])
            used = n
    return chunks


def words(text: str) -> set[str]:
    """Distinct lower-cased words of 3+ letters (hyphenated keys whole), and numbers."""
    return {w for w in re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", text.lower()) if len(w) > 2}


def lexical_keep(ex: LongExample, lengths: list[int], keep: float) -> list[bool]:
    """A question-overlap router (the floor any trained router must beat): sentences ranked by
    how many distinct words (3+ letters, or numbers) they share with the question, ties by
    position; kept in that order while within ``keep`` of the context's tokens."""
    q = words(ex.query.rsplit("\nAnswer:", 1)[0])
    overlap = [len(words(s) & q) for s in ex.sentences]
    order = sorted(range(len(ex.sentences)), key=lambda i: (-overlap[i], i))
    out, used, budget = [False] * len(ex.sentences), 0, keep * sum(lengths)
    for i in order:
        if used + lengths[i] <= budget:
            out[i] = True
            used += lengths[i]
    return out


def sentence_evidence(lm: LoadedModel, ex: LongExample, method: str = "group-testing", max_new_tokens: int = 10,
                      tolerance: float = 1.0, chunk_tokens: int | None = None) -> dict:
    """Evidence chunks of the model's own answer (masking chunks' keys, every variant a
    forward pass over the full prompt). Chunks are sentences, or consecutive sentences of at
    most ``chunk_tokens`` tokens (:func:`chunk_sentences`). Adds ``chunks`` (sentence indices
    per chunk), ``evidence_sentences``, ``gold_recall`` (share of the gold sentences inside
    the evidence chunks) and ``correct`` to :func:`masklab.pretrained.evidence.cite`'s result."""
    from masklab.pretrained.evidence import cite

    chunks = chunk_sentences(sentence_tokens(lm, ex), chunk_tokens)
    texts = [" ".join(ex.sentences[i] for i in c) for c in chunks]
    res = cite(lm, texts, ex.query, method=method, tolerance=tolerance, max_new_tokens=max_new_tokens)
    ev = sorted(i for c in res["evidence"] for i in chunks[c])
    res["chunks"], res["evidence_sentences"] = chunks, ev
    res["gold_recall"] = sum(g in set(ev) for g in ex.gold) / len(ex.gold)
    res["correct"] = score(res["answer"], ex)
    res.pop("sentences")
    return res
