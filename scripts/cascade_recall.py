"""Which first stage should choose the windows the cross-encoder reads in a long document? Window recall
and cost on val, for BM25, the shipped pruner's cosines and their hybrid.

    python scripts/cascade_recall.py [--questions 320] [--tokens 20000] [--windows 8 16 24 32] [--threads 1]
                                     [--out results/cascade]

Each of the corpus's val questions (taken in turn from each document) is hidden in a long document: its
own document's units at a random place (seeded) among the units of the other val documents, up to
``--tokens`` SmolLM2 tokens. The cross pruner cuts the long document into its windows
(:meth:`masklab.lab.cross.CrossPruner.windows`); a first stage scores every unit, each window takes
its best unit's score, and the ``--windows`` best windows are read. A question counts when every
marked answering unit lies in a window read (``recall`` at each count of windows, Wilson intervals,
McNemar against the pruner's; each row stores how many windows its evidence needed).
Stages: ``bm25`` (the ``bm25`` router), ``pruner`` (the shipped pruner's cosines) and ``hybrid``
(reciprocal-rank fusion of the two, :func:`masklab.context.routers.fused.fuse`'s ``rrf``). The seconds each
stage takes on a fresh long document, and the cross-encoder's read of 16 windows, are timed apart
(``--timing-rounds`` rounds, medians). Writes ``OUT/results.json`` with every question's outcome.
"""

from __future__ import annotations

import argparse
import random
from bisect import bisect_right
from itertools import accumulate
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("bm25", "pruner", "hybrid")


def chosen(windows, scores: torch.Tensor, n: int | None = None) -> list:
    """The ``n`` windows whose best unit scores highest (None: all, best first)."""
    return sorted(windows, key=lambda w: -float(scores[w.start : w.stop].max()))[:n]


def needed(windows, scores: torch.Tensor, gold: set[int]) -> int:
    """How many of the best windows (:func:`chosen`) must be read to hold every unit of ``gold``."""
    order = chosen(windows, scores)
    return max(next(k for k, w in enumerate(order, 1) if w.start <= u < w.stop) for u in gold)


def main() -> int:
    from masklab.context.routers import load_router
    from masklab.context.routers.fused import fuse
    from masklab.lab.realdocs import in_turn
    from masklab.lab.stats import mcnemar, wilson
    from masklab.lab.tasks import realdocs
    from masklab.lab.tasks.realdocs import answering_units
    from masklab.pretrained.models import load
    from masklab.text.document import Document, segment
    from masklab.util.files import write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=320, help="val questions, taken in turn from each document")
    ap.add_argument("--tokens", type=int, default=20000, help="the long document's length in SmolLM2 tokens")
    ap.add_argument(
        "--windows",
        type=int,
        nargs="+",
        default=[8, 16, 24, 32],
        help="windows the cross-encoder reads (each count measured)",
    )
    ap.add_argument("--timing-rounds", type=int, default=3, help="rounds of the timing on a fresh document")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "cascade", help="output folder")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = load("smollm2-135m", threads=a.threads).tokenizer
    qs = in_turn(realdocs.load("val", realdocs.CORPUS))[: a.questions]
    docs = {q.doc: segment(q.text, tok) for q in qs}
    lengths = {d: sum(doc.lengths(tok)) for d, doc in docs.items()}
    from masklab.lab.routers import load_any
    from masklab.lab.routers.cross import SHIPPED  # the lab's cross: the file once packaged (scripts/cross_val.py)

    cross, bm25, pruner = load_any("cross", path=SHIPPED), load_router("bm25"), load_router("pruner")
    rows = []
    it = qs
    if sys.stderr.isatty():
        from tqdm import tqdm

        it = tqdm(qs, desc="cascade recall", file=sys.stderr)
    for k, q in enumerate(it):
        rng = random.Random(k)
        others = [d for d in docs if d != q.doc]
        rng.shuffle(others)
        parts, total = [], lengths[q.doc]
        for d in others:
            if total >= a.tokens:
                break
            parts.append(d)
            total += lengths[d]
        parts.insert(rng.randrange(len(parts) + 1), q.doc)
        units, offset = [], 0
        for d in parts:
            if d == q.doc:
                offset = len(units)
            units += docs[d].units
        gold = {offset + u for g in answering_units(docs[q.doc], q.spans()) for u in g}
        if not gold:
            continue
        wins = cross.model.windows(q.question, units)
        sparse = bm25.read(Document(units=units), [q.question]).values[0]
        # each document's units are embedded once (the embedder's cache); a unit's cosine ignores its neighbours
        dense = torch.cat([pruner.score(docs[d], q.question) for d in parts])
        scores = {"bm25": sparse, "pruner": dense, "hybrid": fuse(sparse, dense, "rrf", 1.0)}
        row = {"id": q.id, "kind": q.kind, "units": len(units), "windows": len(wins)}
        row.update({name: needed(wins, s, gold) for name, s in scores.items()})
        rows.append(row)
    long_units = [u for d in docs.values() for u in d.units]
    long = Document(
        units=long_units[: bisect_right(list(accumulate(Document(units=long_units).lengths(tok))), a.tokens)]
    )
    question = qs[0].question
    timing: dict[str, list[float]] = {s: [] for s in ("bm25", "pruner", "cross_read_16")}
    for _ in range(a.timing_rounds):
        pruner.model.embedder.clear_cache()
        t0 = time.perf_counter()
        s = bm25.read(long, [question]).values[0]
        timing["bm25"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pruner.score(long, question)
        timing["pruner"].append(time.perf_counter() - t0)
        wins = chosen(cross.model.windows(question, long.units), s, 16)
        t0 = time.perf_counter()
        cross.model.window_logits(wins)
        timing["cross_read_16"].append(time.perf_counter() - t0)
    summary = []
    for kind in ("all", "multi-unit"):
        sub = [r for r in rows if kind == "all" or r["kind"] in realdocs.MULTI_UNIT]
        for n in a.windows:
            for name in STAGES:
                hit = [r[name] <= n for r in sub]
                lo, hi = wilson(sum(hit), len(sub))
                cell = {
                    "task": f"{kind}@{n}",
                    "method": name,
                    "n": len(sub),
                    "recall": sum(hit) / len(sub),
                    "recall_lo": lo,
                    "recall_hi": hi,
                }
                if name != "pruner":
                    cell["p_vs_pruner"] = mcnemar(hit, [r["pruner"] <= n for r in sub])
                summary.append(cell)
    med = {k: statistics.median(v) for k, v in timing.items()}
    summary += [{"task": "seconds", "method": k, "seconds": v} for k, v in med.items()]
    out = {
        "command": "python scripts/cascade_recall.py " + " ".join(sys.argv[1:]),
        "questions": len(rows),
        "tokens": a.tokens,
        "windows": a.windows,
        "threads": a.threads,
        "timing_units": len(long.units),
        "timing": timing,
        "summary": summary,
        "rows": rows,
    }
    write_json(a.out / "results.json", out)
    for s in summary:
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
