"""Trained sentence routers for long contexts that read the context *before* the answer's
prefill, cheaply: through the LM's first ``layers`` decoder layers over ``question + context``.

Why the question first: a causal LM's context states cannot see a question that comes
after the context, and what to keep depends on the question (which key, which chain).
This pass is separate from the answer's prefill anyway. Measured cost of the first 1 / 2
layers: 0.033x / 0.066x of a full prefill (``benchmarks/longctx_prefill.py``).

Features of sentence ``i`` (:func:`early_features`, ``(N, D + 6)``): its tokens' mean
final-normed state after layer ``layers``, minus the mean over the example's sentences
(so features are relative to the filler around it); the cosine of its mean state with the
question's mean state; the largest cosine of one of its tokens with the question's mean;
relative position; relative length; the share of the question's words it contains
(the lexical router's score); and how much of that share a *later* sentence matches too
(:func:`superseded`: a statement restated or updated later scores high). A per-sentence
linear score cannot see the other sentences, so without this last feature it cannot tell
the latest of several matching statements from the earlier ones (measured: it kept the
stale statements next to the gold one). Both routers get the same features; they differ
only in their labels.

Kept sentences (:func:`keep_by_scores`): the highest-scored while within the kept fraction,
stopping at the router's decision boundary (score < 0: the router says "not evidence")
unless ``fill``; the kept fraction is then a cap, and the ``kept`` metric says what was used.

Labels per training example (:func:`training_labels`, only examples the LM answers
correctly on the full context):

* ``evidence`` - the sentences of the group-testing evidence set of the LM's own answer
  (:func:`masklab.pretrained.longctx.sentence_evidence`, forward passes counted);
* ``attention`` - the sentences with the most attention mass from the answer position
  (mean over layers and heads), as many as the evidence set has (at least one).

The router is :class:`masklab.pretrained.router.SentenceRouter` (a logistic regression on
standardised features), one per label kind, trained on examples from seeds disjoint from
the test examples and stored as safetensors + JSON (:func:`train_or_load`).
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import hashlib
import json
import time
from pathlib import Path

import torch
from torch import Tensor

from masklab.errors import MasklabError
from masklab.pretrained.lm import split_answer_prefix
from masklab.pretrained.models import LoadedModel
from masklab.pretrained.router import ROUTER_LABELS, SentenceRouter
from masklab.tasks.longctx import LongExample, make_examples

ROUTER_LAYERS = 2
FEATURES = "v2-superseded"  # in the router cache key: routers stored with other features are retrained
TRAIN_SEED_BASE = 1_000_000  # training examples: make_examples(seed=TRAIN_SEED_BASE + seed), disjoint from tests


@contextlib.contextmanager
def first_layers(model, k: int):
    """Run only the first ``k`` decoder layers of a Hugging Face causal LM's base model
    (``model.model``; its final norm still applies)."""
    base = model.model
    layers, n = base.layers, base.config.num_hidden_layers
    if not 1 <= k <= n:
        raise MasklabError(f"the router reads 1..{n} layers of this model, got {k}")
    base.layers, base.config.num_hidden_layers = layers[:k], k
    try:
        yield base
    finally:
        base.layers, base.config.num_hidden_layers = layers, n


def question_text(ex: LongExample) -> str:
    """The question without the answer prefix: ``"Question: What is ...?"``."""
    return split_answer_prefix(ex.query)[0].strip()


def router_input(tokenizer, sentences: list[str], question: str) -> tuple[Tensor, Tensor]:
    """``question + "\\n" + context`` tokenised (with the tokenizer's special tokens):
    ``ids (T,)`` and ``item (T,)`` = sentence index per token, -2 for the question's
    tokens, -1 for special tokens and the line break."""
    q = question
    text = q + "\n" + " ".join(sentences)
    enc = tokenizer(text, return_offsets_mapping=True)
    starts, pos = [], len(q) + 1
    for s in sentences:
        starts.append(pos)
        pos += len(s) + 1
    item = torch.full((len(enc["input_ids"]),), -1, dtype=torch.long)
    for t, (a, b) in enumerate(enc["offset_mapping"]):
        if b <= a:
            continue
        if b <= len(q):
            item[t] = -2
            continue
        mid = a  # the token's first non-space character decides its sentence
        while mid < b - 1 and text[mid] in " \n":
            mid += 1
        if mid > len(q):
            item[t] = bisect.bisect_right(starts, mid) - 1
    return torch.tensor(enc["input_ids"]), item


def superseded(overlap: list[float]) -> list[float]:
    """Per sentence: ``min(overlap[i], max(overlap[j] for j > i))`` (0 for the last), the
    part of its match with the question that a later sentence matches at least as well."""
    out, later = [0.0] * len(overlap), 0.0
    for i in range(len(overlap) - 1, -1, -1):
        out[i] = min(overlap[i], later)
        later = max(later, overlap[i])
    return out


def question_overlap(sentences: list[str], question: str) -> list[float]:
    """Per sentence: the share of the question's distinct words (3+ letters, or numbers) it contains."""
    from masklab.pretrained.longctx import words

    q = words(question)
    return [len(words(s) & q) / max(1, len(q)) for s in sentences]


@torch.no_grad()
def early_features(lm: LoadedModel, sentences: list[str], question: str, layers: int = ROUTER_LAYERS) -> Tensor:
    """``(N, D + 6)`` features of ``sentences`` from the first ``layers`` layers over
    ``question + "\n" + context`` (module docstring); ``question`` without answer prefix."""
    ids, item = router_input(lm.tokenizer, sentences, question)
    with first_layers(lm.model, layers) as base:
        h = base(input_ids=ids[None], use_cache=False).last_hidden_state[0].float()  # (T, D)
    n = len(sentences)
    m = item >= 0
    count = torch.bincount(item[m], minlength=n).float()
    mean = torch.zeros(n, h.shape[1]).index_add_(0, item[m], h[m]) / count.clamp(min=1)[:, None]
    qm = h[item == -2].mean(0) if (item == -2).any() else h.mean(0)
    cos_mean = torch.nn.functional.cosine_similarity(mean, qm[None], dim=1)
    tok_cos = torch.nn.functional.cosine_similarity(h, qm[None], dim=1)
    cos_max = torch.full((n,), -1.0).scatter_reduce_(0, item[m], tok_cos[m], reduce="amax")
    pos = torch.arange(n, dtype=torch.float32) / max(n - 1, 1)
    rel_len = count / count.mean().clamp(min=1)
    overlap = question_overlap(sentences, question)
    extra = torch.stack([cos_mean, cos_max, pos, rel_len, torch.tensor(overlap), torch.tensor(superseded(overlap))], dim=1)
    return torch.cat([mean - mean.mean(0, keepdim=True), extra], dim=1)


def keep_by_scores(scores: Tensor, lengths: list[int], keep: float, fill: bool = True) -> list[bool]:
    """The highest-scored sentences while their tokens stay within ``keep`` of the context's
    (the top sentence always); unless ``fill``, only sentences scored >= 0 (the router's
    decision boundary). Returns a keep mask over sentences."""
    budget, used = keep * sum(lengths), 0
    out = [False] * len(lengths)
    for i in torch.argsort(scores, descending=True, stable=True).tolist():
        if any(out) and not fill and scores[i] < 0:
            break
        if not any(out) or used + lengths[i] <= budget:
            out[i] = True
            used += lengths[i]
    return out


def route(lm: LoadedModel, router: SentenceRouter, ex: LongExample, lengths: list[int], keep: float,
          layers: int = ROUTER_LAYERS, fill: bool = False) -> tuple[list[bool], float]:
    """The router's keep mask for ``ex`` within ``keep`` of the context's tokens
    (:func:`keep_by_scores`), and its seconds (tokenise + first layers + scoring)."""
    t0 = time.perf_counter()
    scores = router.score(early_features(lm, ex.sentences, question_text(ex), layers))
    return keep_by_scores(scores, lengths, keep, fill=fill), time.perf_counter() - t0


def training_labels(lm: LoadedModel, ex: LongExample, max_new_tokens: int = 10,
                    chunk_tokens: int | None = None) -> dict:
    """Evidence and attention labels of one training example (module docstring).

    Returns ``{"correct", "passes", "seconds", "evidence" (indices), "attention" (indices)}``;
    an example the LM answers wrongly (or emptily) has no labels (``evidence`` None) and
    costs one answer; ``passes`` counts the answer, the evidence search's forward passes
    (each over the full prompt) and the attention pass."""
    from masklab.pretrained.lm import encode
    from masklab.pretrained.longctx import answer, sentence_evidence
    from masklab.pretrained.models import set_attention
    from masklab.pretrained.router import attention_per_sentence

    t0 = time.perf_counter()
    if not answer(lm, ex, max_new_tokens=max_new_tokens)["correct"]:  # one pass; no group testing on wrong answers
        return {"correct": False, "passes": 1, "seconds": time.perf_counter() - t0, "evidence": None, "attention": None}
    try:
        ev = sentence_evidence(lm, ex, max_new_tokens=max_new_tokens, chunk_tokens=chunk_tokens)
    except MasklabError:  # an empty answer has no evidence
        return {"correct": False, "passes": 1, "seconds": time.perf_counter() - t0, "evidence": None, "attention": None}
    if not ev["correct"]:
        return {"correct": False, "passes": ev["forward_passes"], "seconds": time.perf_counter() - t0,
                "evidence": None, "attention": None}
    evidence = ev["evidence_sentences"]
    set_attention(lm, "eager")
    try:
        att = attention_per_sentence(lm, encode(lm, ex.sentences, ex.query), len(ex.sentences))
    finally:
        set_attention(lm, "sdpa")
    top = torch.argsort(att, descending=True)[:max(1, len(evidence))].tolist()
    return {"correct": True, "passes": ev["forward_passes"] + 2, "seconds": time.perf_counter() - t0,
            "evidence": evidence, "attention": sorted(top)}


def fit_routers(features: list[Tensor], labels: dict[str, list[list[int]]], seed: int = 0) -> dict[str, SentenceRouter]:
    """One router per label kind from per-example ``features (N_e, F)`` and label index lists."""
    X = torch.cat(features)
    out = {}
    for kind, per_ex in labels.items():
        y = torch.cat([torch.zeros(f.shape[0]).index_fill_(0, torch.tensor(idx, dtype=torch.long), 1.0)
                       for f, idx in zip(features, per_ex)])
        if y.sum() == 0:
            raise MasklabError(f"no positive {kind} labels to train a router on")
        out[kind] = SentenceRouter.fit(X, y, seed=seed)
    return out


def router_key(model: str, tasks: list[str], length: int, params: dict) -> str:
    blob = json.dumps({"model": model, "tasks": sorted(tasks), "length": length, **params}, sort_keys=True)
    return f"{model}-{length}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def save_routers(path: Path, routers: dict[str, SentenceRouter], meta: dict) -> None:
    """``path.safetensors`` (weights) + ``path.json`` (meta); written atomically."""
    import os

    from safetensors.torch import save_file

    from masklab.files import write_json

    tensors = {f"{k}.{f}": getattr(r, f).contiguous() for k, r in routers.items() for f in ("weight", "bias", "mean", "std")}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path.with_suffix(".safetensors"))
    write_json(path.with_suffix(".json"), meta)


def load_routers(path: Path) -> tuple[dict[str, SentenceRouter], dict]:
    from safetensors.torch import load_file

    from masklab.files import read_json

    t = load_file(str(path.with_suffix(".safetensors")))
    meta = read_json(path.with_suffix(".json"))
    return {k: SentenceRouter(*(t[f"{k}.{f}"] for f in ("weight", "bias", "mean", "std"))) for k in meta["kinds"]}, meta


def train_or_load(lm: LoadedModel, model: str, tasks: list[str], length: int, n_per_task: int, cache_dir: Path,
                  seed: int = 0, task_kw: dict | None = None, max_new_tokens: int = 10,
                  chunk_tokens: int | None = None, layers: int = ROUTER_LAYERS, log=None) -> tuple[dict, dict]:
    """The evidence and attention routers for (model, task set, length): loaded from
    ``cache_dir`` when trained before with the same settings, else trained on
    ``n_per_task`` examples per task from seeds disjoint from the test seeds and saved.

    Returns ``(routers {"evidence", "attention"}, meta)``; meta holds ``examples``,
    ``labelled`` (answered correctly), ``ev_passes`` (forward passes the labels cost),
    ``seconds``, ``per_task`` counts and ``layers``."""
    task_kw = task_kw or {}
    params = {"n_per_task": n_per_task, "seed": seed, "layers": layers, "max_new_tokens": max_new_tokens, "features": FEATURES,
              "chunk_tokens": chunk_tokens, **task_kw}
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / router_key(model, tasks, length, params)
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one trainer per cache; the others then load its file
        if path.with_suffix(".json").exists() and path.with_suffix(".safetensors").exists():
            return load_routers(path)
        t0 = time.perf_counter()
        feats, labels = [], {k: [] for k in ROUTER_LABELS}
        passes, per_task = 0, {}
        for task in tasks:
            exs = make_examples(task, length, n_per_task, seed=TRAIN_SEED_BASE + seed, tokenizer=lm.tokenizer, **task_kw)
            got = 0
            for ex in exs:
                lab = training_labels(lm, ex, max_new_tokens=max_new_tokens, chunk_tokens=chunk_tokens)
                passes += lab["passes"]
                if lab["evidence"] is None:
                    continue
                got += 1
                feats.append(early_features(lm, ex.sentences, question_text(ex), layers))
                for k in ROUTER_LABELS:
                    labels[k].append(lab[k])
            per_task[task] = got
            if log:
                log(f"router labels {model} {task}@{length}: {got}/{len(exs)} answered correctly")
        if not feats:
            raise MasklabError(f"{model} answered none of the {n_per_task} training examples per task correctly "
                               f"at {length} tokens: no evidence to train a router on")
        routers = fit_routers(feats, labels, seed=seed)
        meta = {"kinds": list(ROUTER_LABELS), "model": model, "tasks": tasks, "length": length, **params,
                "examples": n_per_task * len(tasks), "labelled": len(feats), "per_task": per_task,
                "ev_passes": passes, "seconds": time.perf_counter() - t0,
                "positives": {k: sum(len(v) for v in labels[k]) for k in ROUTER_LABELS}}
        save_routers(path, routers, meta)
        return routers, meta
