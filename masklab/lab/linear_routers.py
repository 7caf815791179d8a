"""Training the linear unit routers of :mod:`masklab.context.routers.features`: labels, fit,
save, and the cache the ``longctx`` study trains into.

Labels per training document (:func:`make_labels`, only documents the LM answers rightly):
``evidence``, the units of the evidence set of the LM's own answer (group testing or
leave-one-out over key masks, forward passes counted); ``attention``, as many units (at
least one) with the most attention mass from the answer position (mean over layers and
heads). Both routers get the same features, data and model class; only labels differ.
The routers (:class:`~masklab.context.routers.features.LinearRouter`) are stored as
safetensors + JSON (:func:`save_routers`; the product reads them with
:func:`~masklab.context.routers.features.load_routers`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from masklab.context.routers.features import (
    DEFAULT_FEATURE_SET,
    ROUTER_LAYERS,
    LinearRouter,
    features,
    load_routers,
)
from masklab.text.document import Document
from masklab.util.errors import MasklabError

LABELS = ("evidence", "attention")  # the labels a linear router is fitted on


@torch.no_grad()
def attention_per_unit(lm, ids: Tensor, unit: Tensor, n: int, prefix: list | None = None) -> Tensor:
    """``(N,)`` attention mass from the last position of ``ids (T,)`` on each unit (``unit
    (T,)`` = unit index per token, < 0 elsewhere), mean over layers and heads. Switches the
    model to eager attention for the pass; ``prefix`` (the context's cached keys and values,
    :func:`~masklab.pretrained.lm.context_cache`): only the last token is read."""
    from masklab.pretrained.lm import last_token_attention
    from masklab.pretrained.models import set_attention

    set_attention(lm, "eager")
    try:
        a = last_token_attention(lm, ids, prefix).mean((0, 1))  # (T,)
    finally:
        set_attention(lm, "sdpa")
    out = torch.zeros(n)
    m = unit >= 0
    out.index_add_(0, unit[m], a[m])
    return out


def chunk_units(lengths: list[int], chunk_tokens: int | None) -> list[list[int]]:
    """Consecutive units grouped into chunks of at most ``chunk_tokens`` tokens (a longer
    unit is a chunk alone); None: one chunk per unit. Returns unit indices per chunk."""
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


def fit_linear(
    X: Tensor, y: Tensor, steps: int = 300, lr: float = 0.05, l2: float = 1e-2, seed: int = 0
) -> LinearRouter:
    """A :class:`LinearRouter` fitted on ``X (M, F)``, ``y (M,)`` in {0, 1}; positives are re-weighted to balance
    classes."""
    g = torch.Generator().manual_seed(seed)
    mean, std = X.mean(0), X.std(0).clamp(min=1e-4)
    Z = (X - mean) / std
    w = (torch.randn(X.shape[1], generator=g) * 0.01).requires_grad_()
    b = torch.zeros(1, requires_grad=True)
    pos = float(y.sum().clamp(min=1))
    pw = torch.tensor((len(y) - pos) / pos)
    opt = torch.optim.Adam([w, b], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = (
            torch.nn.functional.binary_cross_entropy_with_logits(Z @ w + b, y.float(), pos_weight=pw)
            + l2 * (w**2).sum()
        )
        loss.backward()
        opt.step()
    return LinearRouter(w.detach(), b.detach(), mean, std)


def make_labels(
    lm,
    doc: Document,
    query: str,
    accept: Callable[[str], bool],
    search: str = "group-testing",
    max_new_tokens: int = 10,
    chunk_tokens: int | None = None,
    tolerance: float = 1.0,
    reuse_prefix: bool = True,
) -> dict:
    """Evidence and attention labels of one document (module docstring).

    The LM answers ``query`` from ``doc`` (one greedy generation); a document whose answer
    ``accept`` rejects (or that is empty) gets no labels. Otherwise ``search`` (an evidence
    search of :mod:`masklab.lab.evidence.search`) finds the evidence chunks (units, or
    consecutive units of at most ``chunk_tokens`` tokens, :func:`chunk_units`) under key
    masks (read from each variant's first hidden token on unless ``reuse_prefix`` is False:
    the same labels), and one eager pass gives the attention labels.

    Returns ``{"answer", "correct", "passes", "seconds", "evidence", "attention"}``
    (unit indices, or None without labels); ``passes`` counts every sequence the LM read.
    """
    from masklab.lab.evidence.search import SEARCHES
    from masklab.lab.lm_evidence import SentenceOracle, is_empty_answer

    t0 = time.perf_counter()
    chunks = chunk_units(doc.lengths(lm.tokenizer), chunk_tokens)
    texts = [" ".join(doc.units[i] for i in c) for c in chunks]
    oracle = SentenceOracle(
        lm, texts, query, hide="mask", tolerance=tolerance, max_new_tokens=max_new_tokens, reuse_prefix=reuse_prefix
    )
    out = {"answer": oracle.answer, "correct": False, "passes": 1, "evidence": None, "attention": None}
    if is_empty_answer(oracle.generated) or not accept(oracle.generated):
        return {**out, "seconds": time.perf_counter() - t0}
    ev = SEARCHES[search].find(oracle, len(texts))
    evidence = sorted(i for c in ev.items for i in chunks[c])
    from masklab.pretrained.lm import encode

    enc = encode(lm, doc.units, query)  # tokens mapped to units (not chunks)
    same = torch.equal(enc.ids, oracle.enc.ids)  # units read as the search's chunks: its cached keys and values serve
    att = attention_per_unit(lm, enc.ids, enc.item_of_token, len(doc.units), oracle.prefix if same else None)
    top = torch.argsort(att, descending=True, stable=True)[: max(1, len(evidence))].tolist()
    return {
        **out,
        "correct": True,
        "passes": ev.forward_passes + 2,
        "seconds": time.perf_counter() - t0,
        "evidence": evidence,
        "attention": sorted(top),
    }


def fit_routers(feats: list[Tensor], labels: dict[str, list[list[int]]], seed: int = 0) -> dict[str, LinearRouter]:
    """One router per label kind from per-document ``feats (N_d, F)`` and label index lists."""
    X = torch.cat(feats)
    out = {}
    for kind, per_doc in labels.items():
        y = torch.cat(
            [
                torch.zeros(f.shape[0]).index_fill_(0, torch.tensor(idx, dtype=torch.long), 1.0)
                for f, idx in zip(feats, per_doc)
            ]
        )
        if y.sum() == 0:
            raise MasklabError(f"no positive {kind} labels to train a router on")
        out[kind] = fit_linear(X, y, seed=seed)
    return out


def save_routers(path: Path, routers: dict[str, LinearRouter], meta: dict) -> None:
    """``path.safetensors`` (weights) + ``path.json`` (meta: ``kinds`` and how it was made); atomic."""
    from safetensors.torch import save_file

    from masklab.util.files import write_json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"{k}.{f}": getattr(r, f).contiguous() for k, r in routers.items() for f in ("weight", "bias", "mean", "std")
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path.with_suffix(".safetensors"))
    write_json(path.with_suffix(".json"), {**meta, "kinds": list(routers)})


# --------------------------------------------------------------------------- training
TRAIN_SEED_BASE = 1_000_000  # training examples: make_examples(seed=TRAIN_SEED_BASE + seed), disjoint from tests


def router_key(model: str, tasks: list[str], length: int, params: dict) -> str:
    import hashlib
    import json

    blob = json.dumps({"model": model, "tasks": sorted(tasks), "length": length, **params}, sort_keys=True)
    return f"{model}-{length}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def train_or_load(
    lm,
    model: str,
    tasks: list[str],
    length: int,
    n_per_task: int,
    cache_dir: Path,
    seed: int = 0,
    task_kw: dict | None = None,
    max_new_tokens: int = 10,
    chunk_tokens: int | None = None,
    layers: int = ROUTER_LAYERS,
    log=None,
) -> tuple[dict, dict]:
    """The evidence and attention routers for (model, task set, length): loaded from
    ``cache_dir`` when trained before with the same settings, else trained on
    ``n_per_task`` generated examples per task from seeds disjoint from the test seeds
    (group-testing labels, :func:`make_labels`) and saved.

    Returns ``(routers {"evidence", "attention"}, meta)``; meta holds ``examples``,
    ``labelled`` (answered correctly), ``ev_passes`` (forward passes the labels cost),
    ``seconds``, ``per_task`` counts and ``layers``."""
    import fcntl

    from masklab.lab.tasks.longctx import make_examples, score

    task_kw = task_kw or {}
    params = {
        "n_per_task": n_per_task,
        "seed": seed,
        "layers": layers,
        "max_new_tokens": max_new_tokens,
        "features": DEFAULT_FEATURE_SET,
        "chunk_tokens": chunk_tokens,
        **task_kw,
    }
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / router_key(model, tasks, length, params)
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one trainer per cache; the others then load its file
        if path.with_suffix(".json").exists() and path.with_suffix(".safetensors").exists():
            return load_routers(path)
        t0 = time.perf_counter()
        feats, labels = [], {k: [] for k in LABELS}
        passes, per_task = 0, {}
        for task in tasks:
            exs = make_examples(
                task, length, n_per_task, seed=TRAIN_SEED_BASE + seed, tokenizer=lm.tokenizer, **task_kw
            )
            got = 0
            for ex in exs:
                lab = make_labels(
                    lm,
                    ex,
                    ex.query,
                    accept=lambda text, ex=ex: score(text, ex),
                    max_new_tokens=max_new_tokens,
                    chunk_tokens=chunk_tokens,
                )
                passes += lab["passes"]
                if lab["evidence"] is None:
                    continue
                got += 1
                feats.append(features(lm, ex.units, ex.question, layers))
                for k in LABELS:
                    labels[k].append(lab[k])
            per_task[task] = got
            if log:
                log(f"router labels {model} {task}@{length}: {got}/{len(exs)} answered correctly")
        if not feats:
            raise MasklabError(
                f"{model} answered none of the {n_per_task} training examples per task correctly "
                f"at {length} tokens: no evidence to train a router on"
            )
        routers = fit_routers(feats, labels, seed=seed)
        meta = {
            "model": model,
            "tasks": tasks,
            "length": length,
            **params,
            "examples": n_per_task * len(tasks),
            "labelled": len(feats),
            "per_task": per_task,
            "ev_passes": passes,
            "seconds": time.perf_counter() - t0,
            "positives": {k: sum(len(v) for v in labels[k]) for k in LABELS},
        }
        save_routers(path, routers, meta)
        return load_routers(path)
