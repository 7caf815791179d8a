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

Keep-set labels (``labels="keepset"``, :func:`keepset_label`) credit evidence made of
several units, which the random ablations' linear surrogate underrates: the model reads
*only* a few units (their text alone, nothing else of the window) and the written answer's
log-likelihood is measured with none, with each unit alone (leave-one-in) and with each
pair of the ``PAIR_TOP`` best single units. A pair that beats its best member by
``PAIR_MARGIN`` nats credits both of its units (two sentences that answer together); a
restatement earns what the statement it restates earns; a superseded statement read alone
does not raise the current answer's likelihood, so only the current one is credited
(:func:`keepset_target`).
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
# random variants per question (ContextCite uses 32-256 for longer contexts; the windows here have about 14 units)
ABLATIONS = 20
LASSO_ALPHA = 0.01  # ContextCite's regularisation
LABELLERS = ("lasso", "keepset")
PAIR_TOP = 5  # keep-set labels: pairs among this many best single units (10 pairs)
PAIR_MARGIN = 1.0  # nats a pair must gain over its best member to credit both
PRECISIONS = ("fp32", "bf16")  # label_shard's passes autocast (bf16 halves a pass on this CPU; rows record it)


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

    from masklab.lab.linear_routers import attention_per_unit
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
    return {
        "weights": [round(float(w), 5) for w in surrogate.coef_],
        "attention": [round(float(a), 6) for a in att],
        "logp_full": oracle.full_logp,
        "logp_mean": float(y.mean()),
        "r2": float(surrogate.score(x, y)),
        "passes": oracle.passes + 2,
        "seconds": time.perf_counter() - t0,
    }


@torch.no_grad()
def read_alone(lm, variants: list[list[str]], query: str, answer: torch.Tensor, batch: int = 16) -> torch.Tensor:
    """``(V,)`` the log-likelihood of ``answer (A,)`` when the model reads only each variant's
    units (their text, in the model's prompt format), ``batch`` variants a pass (left-padded)."""
    from masklab.pretrained.lm import encode

    seqs = [torch.cat([encode(lm, v, query).ids, answer]) for v in variants]
    A, out = answer.numel(), []
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    for b in range(0, len(seqs), batch):
        chunk = seqs[b : b + batch]
        T = max(x.numel() for x in chunk)
        ids = torch.full((len(chunk), T), pad, dtype=torch.long)
        mask = torch.zeros(len(chunk), T, dtype=torch.long)
        for r, x in enumerate(chunk):
            ids[r, T - x.numel() :], mask[r, T - x.numel() :] = x, 1
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        dev = lm.model.device
        logits = (
            lm.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), logits_to_keep=A + 1)
            .logits[:, :A]
            .float()
            .cpu()
        )
        lp = torch.log_softmax(logits, -1).gather(-1, answer[None, :, None].expand(len(chunk), -1, 1))[..., 0]
        out.append(lp.sum(-1))
    return torch.cat(out)


@torch.no_grad()
def keepset_label(lm, units: list[str], question: str, answer: str, pair_top: int = PAIR_TOP) -> dict:
    """Keep-set log-likelihoods of the written ``answer`` (module docstring): ``logp_empty``
    (no unit read), ``logp_single`` (N,) (each unit read alone), ``pairs`` (``[i, j, logp]``
    for each pair of the ``pair_top`` best single units), ``logp_full`` (the whole window),
    ``gains`` (N,): how much the unit's best set (itself alone, or a pair with it that beats
    both its units alone by ``PAIR_MARGIN``) raises the log-likelihood over none, in nats,
    and ``passes`` and ``seconds``."""
    from itertools import combinations

    from masklab.lab.lm_evidence import SentenceOracle
    from masklab.text.query import Query

    t0 = time.perf_counter()
    n = len(units)
    query, ans = Query(question).text, answer_ids(lm, answer)
    full = SentenceOracle(lm, units, query, hide="delete", answer_ids=ans).full_logp
    lps = read_alone(lm, [[]] + [[u] for u in units], query, ans)
    empty, single = float(lps[0]), lps[1:]
    top = sorted(torch.argsort(single, descending=True, stable=True)[:pair_top].tolist())
    pairs = list(combinations(top, 2))
    pair_lp = read_alone(lm, [[units[i], units[j]] for i, j in pairs], query, ans).tolist() if pairs else []
    best = single.clone()  # each unit's best set: alone, or a pair that beats both its units read alone
    for (i, j), lp in zip(pairs, pair_lp):
        if lp - max(single[i], single[j]) > PAIR_MARGIN:
            best[i], best[j] = max(best[i], lp), max(best[j], lp)
    return {
        "logp_empty": empty,
        "logp_single": [round(float(x), 4) for x in single],
        "pairs": [[i, j, round(float(lp), 4)] for (i, j), lp in zip(pairs, pair_lp)],
        "logp_full": full,
        "gains": [round(float(b) - empty, 4) for b in best],
        "passes": 2 + n + len(pairs),
        "seconds": time.perf_counter() - t0,
    }


def keepset_target(row: dict, gain: float, margin: float = PAIR_MARGIN) -> list[int]:
    """The units (indices into ``row["window"]``) a keep-set row credits: the best single unit
    and every unit read alone within ``margin`` nats of it (restatements), and both units of
    every pair that beats its best member by ``margin``; nothing when no set raises the
    answer's log-likelihood by ``gain`` nats over reading none."""
    single, empty = row["logp_single"], row["logp_empty"]
    if not single:
        return []
    best = max(single)
    out = {i for i, lp in enumerate(single) if lp >= best - margin and lp - empty > gain}
    for i, j, lp in row["pairs"]:
        if lp - max(single[i], single[j]) > margin and lp - empty > gain:
            out |= {i, j}
    return sorted(out)


def stamp(lm, top: int, ablations: int, labels: str = "lasso") -> dict:
    """What makes a label row: the model, the window and the ablations or the keep sets
    (rows record their code too)."""
    if labels == "keepset":
        return {"model": lm.name, "top": top, "labels": labels, "pair_top": PAIR_TOP}
    return {"model": lm.name, "top": top, "ablations": ablations}


def question_key(q) -> str:
    """A question's id and the digest of its text, document and written answer."""
    h = hashlib.sha256("\0".join([q.question, q.text, q.answers[0]]).encode()).hexdigest()[:12]
    return f"{q.id}:{h}"


def label_questions(
    lm,
    questions: list,
    path: Path,
    top: int = WINDOW_TOP,
    ablations: int = ABLATIONS,
    progress: bool = True,
    limit_seconds: float | None = None,
    labels: str = "lasso",
) -> list[dict]:
    """Label ``questions`` (each with ``id``, ``question``, ``text``, ``answers``, ``evidence``)
    into ``path`` (JSON lines, resumable); returns every row made for them with this stamp.
    ``limit_seconds``: stop after the question that passes this much time (the rest wait
    for the next run). ``labels``: ``lasso`` (random ablations, :func:`label`) or
    ``keepset`` (:func:`keepset_label`)."""
    from masklab.lab.tasks.realdocs import answering_units
    from masklab.text.document import segment
    from masklab.util.files import append_jsonl, read_jsonl

    from masklab.lab.revision import code_hash

    from masklab.util.errors import check_choices

    check_choices("labels", [labels], LABELLERS)
    st = stamp(lm, top, ablations, labels)
    done = {r["key"]: r for r in read_jsonl(path) if {k: r.get("stamp", {}).get(k) for k in st} == st}
    todo = [q for q in questions if question_key(q) not in done]
    docs: dict[str, Document] = {}
    it = todo
    if progress and todo:
        from tqdm import tqdm

        it = tqdm(todo, desc=f"{labels} labels {lm.name}", file=sys.stderr)
    t0 = time.perf_counter()
    for q in it:
        if q.doc not in docs:
            docs[q.doc] = segment(q.text, lm.tokenizer)
        doc = docs[q.doc]
        win = window(doc, q.question, top)
        units = [doc.units[i] for i in win]
        res = (
            keepset_label(lm, units, q.question, q.answers[0])
            if labels == "keepset"
            else label(lm, units, q.question, q.answers[0], ablations)
        )
        marked = sorted({u for g in answering_units(doc, q.spans()) for u in g})
        row = {
            "key": question_key(q),
            "id": q.id,
            "doc": q.doc,
            "kind": q.kind,
            "units": len(doc.units),
            "window": win,
            "marked": marked,
            **res,
            "precision": devices.precision(),
            "stamp": {**st, "code": code_hash("masklab.lab.labels")},
        }
        append_jsonl(path, row)
        done[row["key"]] = row
        if limit_seconds is not None and time.perf_counter() - t0 > limit_seconds:
            break
    return [done[question_key(q)] for q in questions if question_key(q) in done]


def corpus_questions(root: str, split: str, kinds: str | None = None) -> list:
    """The questions of a corpus folder's split (``root``: a folder name under ``masklab/data``),
    taken in turn from each document (a partial run covers every document), of ``kinds``
    (comma-separated; None: all)."""
    from masklab.lab.realdocs import in_turn
    from masklab.lab.tasks import realdocs

    qs = in_turn(realdocs.load(split, realdocs.DATA / root))
    return [q for q in qs if kinds is None or q.kind in kinds.split(",")]


def label_shard(spec: dict, ckpt_dir: Path) -> dict:
    """One run of the labelling study (:func:`masklab.lab.runner.run_study`, so ``--executor ray``
    spreads the shards over a cluster): label shard ``i`` of ``n`` of a corpus split's questions
    (questions ``i, i+n, ...``) into ``params["file"]`` (JSON lines, resumable), skipping
    questions another file of the same labels already holds; ``params``: ``root``, ``split``,
    ``labels``, ``kinds``, ``shard`` (``"i/n"``), ``file``, ``base`` (the name its files of the same
    labels start with), ``minutes`` (stop after the
    question that passes them; None: label all)."""
    from masklab.pretrained.models import load
    from masklab.util.files import read_jsonl

    p = spec["params"]
    i, n = (int(x) for x in p["shard"].split("/"))
    path = Path(p["file"])
    path.parent.mkdir(parents=True, exist_ok=True)
    qs = corpus_questions(p["root"], p["split"], p.get("kinds"))[i::n]
    same = path.parent.glob(f"{p['base']}*.jsonl")  # the files of the same labels (earlier runs, other shards)
    elsewhere = {r["key"] for f in same if f != path for r in read_jsonl(f)}
    qs = [q for q in qs if question_key(q) not in elsewhere]
    lm = load(spec["model"], threads=torch.get_num_threads())
    limit = None if p.get("minutes") is None else p["minutes"] * 60
    with devices.autocast(torch.device("cpu"), devices.precision()):
        rows = label_questions(lm, qs, path, WINDOW_TOP, ABLATIONS, False, limit, labels=p["labels"])
    return {
        "metrics": {
            "labelled": len(rows),
            "of": len(qs),
            "seconds_per_question": sum(r["seconds"] for r in rows) / max(1, len(rows)),
        }
    }
