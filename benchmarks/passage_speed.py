"""The passage pruner's speed (``pruner-passage``: both hops) beside today's default ``pruner-ctx``, from one
interleaved run.

    python benchmarks/passage_speed.py [--tokens 2000] [--long-tokens 20000] [--rounds 5] [--batch 32] [--threads 2]
                                       [--json benchmarks/passage_speed.json]

A real document (``pydoc-execmodel`` of the second test split, its leading units up to ``--tokens`` SmolLM2
tokens) and the benchmark's questions about it. Each round, for each router in turn, on a fresh document (every
cache emptied): ``first`` (the units embedded, then the head; the passage pruner also embeds its second hop's
query and reads BM25 over units, paragraphs and sections), ``next`` (one more question on the embedded document),
``batch`` (``--batch`` questions in one ``read``, per question) and ``long`` (one question on a ``--long-tokens``
document: the second test split's documents one after another). Medians over rounds, and each figure's ratio to
``pruner-ctx``'s. Goals (issue 66, docs/context.md): the default's first question on a fresh 2,000-token document
<= 0.5 s with both hops, a further question <= 30 ms, a 20,000-token document <= 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from itertools import accumulate
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
ROUTERS = ("pruner-ctx", "pruner-passage")
GOALS = {"first": 0.5, "next": 0.03, "long": 3.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000, help="document length in SmolLM2 tokens")
    ap.add_argument("--long-tokens", type=int, default=20000, help="the long document's length in SmolLM2 tokens")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians are reported)")
    ap.add_argument("--batch", type=int, default=32, help="questions per batched read")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from masklab.context.routers import load_router
    from masklab.lab.revision import git_rev
    from masklab.lab.tasks import realdocs
    from masklab.pretrained.models import load
    from masklab.text.document import segment

    tok = load("smollm2-135m", threads=args.threads).tokenizer
    doc, questions = realdocs.speed_document(args.tokens, tok)
    batch = (questions * (args.batch // len(questions) + 1))[: args.batch]
    docs = [segment(d, tok) for d in dict.fromkeys(q.text for q in realdocs.load("test2"))]
    from masklab.context.router import stack

    # the documents as passages up to --long-tokens, each unit keeping its paragraph, section and passage
    long = stack([d for d, end in zip(docs, accumulate(sum(d.lengths(tok)) for d in docs)) if end <= args.long_tokens])
    routers = {name: load_router(name) for name in ROUTERS}

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def fresh() -> None:
        for r in routers.values():
            r.pruner.embedder.clear_cache()

    times = {f"{n}_{k}": [] for n in ROUTERS for k in ("first", "next", "batch", "long")}
    for r in range(args.rounds):
        q, q2 = questions[r % len(questions)], questions[(r + 1) % len(questions)]
        for name in ROUTERS[r % 2 :] + ROUTERS[: r % 2]:  # interleaved, each first in turn
            router = routers[name]
            fresh()
            times[f"{name}_first"].append(timed(lambda: router.read(doc, [q])))
            times[f"{name}_next"].append(timed(lambda: router.read(doc, [q2])))
            fresh()
            times[f"{name}_batch"].append(timed(lambda: router.read(doc, batch)) / len(batch))
            fresh()
            times[f"{name}_long"].append(timed(lambda: router.read(long, [q])))
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "command": "python benchmarks/passage_speed.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "json" and v is not None),
        "git_rev": git_rev(),
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "load_average": list(os.getloadavg()),
        "units": len(doc.units),
        "tokens": sum(doc.lengths(tok)),
        "long_units": len(long.units),
        "long_tokens": sum(long.lengths(tok)),
        "long_passages": len(set(long.passage_of or [0])),
        "rounds": args.rounds,
        "batch": len(batch),
        "seconds": med,
        "rounds_seconds": times,
        "ratio_to_ctx": {
            k: med[f"pruner-passage_{k}"] / med[f"pruner-ctx_{k}"] for k in ("first", "next", "batch", "long")
        },
        "goals": GOALS,
        "met": {k: med[f"pruner-passage_{k}"] <= v for k, v in GOALS.items()},
    }
    print(f"{len(doc.units)} units, {out['tokens']} tokens; long: {out['long_tokens']} tokens; {args.threads} threads")
    for k, v in med.items():
        print(f"  {k:<22} {v * 1000:9.1f} ms")
    print("  passage / ctx:", {k: round(v, 2) for k, v in out["ratio_to_ctx"].items()}, "goals met:", out["met"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
