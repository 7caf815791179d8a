"""Causal labels on real documents, without annotation: which units the answering model
needs to produce a written answer.

For a (document, question, written answer) the model reads a *window* of the document, the
units that BM25 or the dense router rank in their top ``k`` for the question (in reading
order: the hard negatives a pruner must learn to tell apart, and most answering units;
:func:`window`), and the written answer is teacher-forced after the question in the model's
prompt format. ContextCite's recipe gives every unit a weight: ``ablations`` random
variants each keep every unit with probability 1/2 (hidden units' keys are masked), and a
sparse linear model (Lasso) of the answer's log-likelihood on the kept units is fitted;
a unit's weight is how much keeping it raises the log-likelihood (:func:`label`). The
attention labels of the control come from one eager pass of the same model on the same
window (attention mass of the last prompt position on each unit, as ``masklab
train-router`` has them).

:func:`label_questions` labels a list of questions, one JSON line each in a resumable file
(a killed run continues after the last finished question; a line names the model, the
window's size and the number of ablations, so lines made otherwise are not reused, and
records the code and precision that made it), with a
progress bar and the seconds and passes of each question.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import torch

from masklab.util import device as devices
from masklab.text.document import Document

WINDOW_TOP = 8  # units each of bm25 and dense propose
ABLATIONS = 20  # random variants per question (ContextCite uses 32-256 for longer contexts; the windows here have about 14 units)
LASSO_ALPHA = 0.01  # ContextCite's regularisation


def window(doc: Document, question: str, top: int = WINDOW_TOP, embedder=None) -> list[int]:
    """Indices (ascending) of the units among the ``top`` of ``bm25`` or of ``dense``."""
    from masklab.context.routers.bm25 import BM25
    from masklab.context.routers.dense import Dense

    picked: set[int] = set()
    for router in (BM25(), Dense(embedder=embedder)):
        s = router.score(doc, question)
        picked |= set(torch.argsort(s, descending=True, stable=True)[:top].tolist())
    return sorted(picked)


def answer_ids(lm, answer: str) -> torch.Tensor:
    """``(A,)`` the written answer's tokens as the model would continue the prompt (a leading space)."""
    return torch.tensor(lm.tokenizer(" " + answer.strip(), add_special_tokens=False)["input_ids"])


@torch.no_grad()
def label(lm, units: list[str], question: str, answer: str, ablations: int = ABLATIONS, seed: int = 0) -> dict:
    """Causal weights and attention of each of ``units`` (the window, in reading order) for
    the written ``answer`` (module docstring). Returns ``weights`` (N,), ``attention`` (N,),
    ``logp_full`` (every unit visible), ``logp_mean`` (over the variants), ``r2`` of the
    surrogate on its variants, ``passes`` and ``seconds``."""
    from sklearn.linear_model import Lasso

    from masklab.context.routers.features import attention_per_unit
    from masklab.lab.lm_evidence import SentenceOracle
    from masklab.text.query import Query

    t0 = time.perf_counter()
    oracle = SentenceOracle(lm, units, Query(question).text, hide="mask", answer_ids=answer_ids(lm, answer))
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(ablations, len(units), generator=g) < 0.5
    logp, _ = oracle.scores(keep)
    x, y = keep.float().numpy(), logp.numpy()
    surrogate = Lasso(alpha=LASSO_ALPHA, max_iter=10000).fit(x, y)
    att = attention_per_unit(lm, oracle.enc.ids, oracle.enc.item_of_token, len(units), oracle.prefix)
    return {"weights": [round(float(w), 5) for w in surrogate.coef_], "attention": [round(float(a), 6) for a in att],
            "logp_full": oracle.full_logp, "logp_mean": float(y.mean()), "r2": float(surrogate.score(x, y)),
            "passes": oracle.passes + 2, "seconds": time.perf_counter() - t0}


def stamp(lm, top: int, ablations: int) -> dict:
    """What makes a label row: the model, the window and the ablations (rows record their code too)."""
    return {"model": lm.name, "top": top, "ablations": ablations}


def question_key(q) -> str:
    """A question's id and the digest of its text, document and written answer."""
    h = hashlib.sha256("\0".join([q.question, q.text, q.answers[0]]).encode()).hexdigest()[:12]
    return f"{q.id}:{h}"


def label_questions(lm, questions: list, path: Path, top: int = WINDOW_TOP, ablations: int = ABLATIONS,
                    progress: bool = True, limit_seconds: float | None = None) -> list[dict]:
    """Label ``questions`` (each with ``id``, ``question``, ``text``, ``answers``, ``evidence``)
    into ``path`` (JSON lines, resumable); returns every row made for them with this stamp.
    ``limit_seconds``: stop after the question that passes this much time (the rest wait
    for the next run)."""
    from masklab.lab.tasks.realdocs import answering_units
    from masklab.text.document import segment
    from masklab.util.files import append_jsonl, read_jsonl

    from masklab.lab.revision import code_hash

    st = stamp(lm, top, ablations)
    done = {r["key"]: r for r in read_jsonl(path) if {k: r.get("stamp", {}).get(k) for k in st} == st}
    todo = [q for q in questions if question_key(q) not in done]
    docs: dict[str, Document] = {}
    it = todo
    if progress and todo:
        from tqdm import tqdm

        it = tqdm(todo, desc=f"causal labels {lm.name}", file=sys.stderr)
    t0 = time.perf_counter()
    for q in it:
        if q.doc not in docs:
            docs[q.doc] = segment(q.text, lm.tokenizer)
        doc = docs[q.doc]
        win = window(doc, q.question, top)
        res = label(lm, [doc.units[i] for i in win], q.question, q.answers[0], ablations)
        marked = sorted({u for g in answering_units(doc, q.spans()) for u in g})
        row = {"key": question_key(q), "id": q.id, "doc": q.doc, "kind": q.kind, "units": len(doc.units),
               "window": win, "marked": marked, **res, "precision": devices.precision(),
               "stamp": {**st, "code": code_hash("masklab.lab.labels")}}
        append_jsonl(path, row)
        done[row["key"]] = row
        if limit_seconds is not None and time.perf_counter() - t0 > limit_seconds:
            break
    return [done[question_key(q)] for q in questions if question_key(q) in done]
