"""The context pruner's and the cross pruner's speed against the round-5 pruner's and dense's, from one
interleaved run.

    python benchmarks/ctx_speed.py [--tokens 2000] [--long-tokens 20000] [--rounds 5] [--batch 32] [--threads 2]
                                   [--json benchmarks/ctx_speed.json]

A real document (``pydoc-execmodel`` of the second test split, its leading units up to ``--tokens``
SmolLM2 tokens) and the benchmark's questions about it. Each round, in turn, on a fresh document
(every cache emptied):

* ``dense_first``: dense's first question (the units embedded, then one cosine);
* ``pruner_first``: the round-5 pruner's first question (its adapted encoder embeds the units);
* ``ctx_first``: ``pruner-ctx``'s first question (the round-5 embeddings, then the context head);
  ``ctx_int8_first``: the same with the encoder's linear layers in int8 (``load_router("pruner-ctx", int8=True)``);
* ``ctx_next``: one more question on the document it has embedded;
* ``ctx_one_by_one`` / ``ctx_batch``: ``--batch`` questions on a fresh document, one call each or one
  ``read`` call, per question;
* ``cross_first`` / ``cross_int8_first`` / ``cross_next``: the lab's ``cross`` router (the file once shipped,
  ``results/cross/shipped.safetensors``) as ``prune`` reads (``read_hops``: the hops its file carries), float
  and int8, and a further question on the same document;
* ``cross_one_by_one`` / ``cross_batch``: ``--batch`` questions, one call each or one ``read_hops``, per question;
* ``cross_long``: one question on a ``--long-tokens`` document (the second test split's documents one after
  another), where the cascade lets the cross-encoder read the windows the bi-encoder picks.

Medians over rounds. The int8 paths' ranking change is measured where it counts: the MRR on the benchmark's
val split against float's. Goals (docs/context.md): ``pruner-ctx``'s first question on a fresh 2,000-token
document <= 0.5 s on two cores; ``cross``'s <= 1.0 s in float and <= 0.5 s in int8 (MRR within 0.01),
a further question <= 0.4 s, the long document <= 3 s; a batch faster per question than one at a time.
"""

from __future__ import annotations

import argparse
from bisect import bisect_right
from itertools import accumulate
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000, help="document length in SmolLM2 tokens")
    ap.add_argument("--long-tokens", type=int, default=20000, help="the long document's length (the cascade)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians are reported)")
    ap.add_argument("--batch", type=int, default=32, help="questions per batched call")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from masklab.context.embedder import load_embedder
    from masklab.context.routers import load_router
    from masklab.lab.tasks import realdocs
    from masklab.lab.tasks.realdocs import answering_units
    from masklab.lab.realdocs import rank_of
    from masklab.pretrained.models import load
    from masklab.text.document import Document, segment

    tok = load("smollm2-135m", threads=args.threads).tokenizer
    doc, questions = realdocs.speed_document(args.tokens, tok)
    batch = (questions * (args.batch // len(questions) + 1))[: args.batch]
    emb = load_embedder()
    pruner, ctx = load_router("pruner"), load_router("pruner-ctx")
    ctx8 = load_router("pruner-ctx", int8=True)
    from masklab.lab.routers import load_any
    from masklab.lab.routers.cross import SHIPPED  # the lab's cross: the file once packaged (scripts/cross_val.py)

    cross, cross8 = load_any("cross", path=SHIPPED), load_any("cross", path=SHIPPED, int8=True)
    units = [u for d in dict.fromkeys(q.text for q in realdocs.load("test2")) for u in segment(d, tok).units]
    ends = list(accumulate(Document(units=units).lengths(tok)))
    long = Document(units=units[: bisect_right(ends, args.long_tokens)])  # the test2 documents up to --long-tokens

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def fresh():
        for e in (emb, ctx.pruner.embedder, ctx8.pruner.embedder):
            e.clear_cache()
        for c in (cross, cross8):
            c.model._ids.clear()
            if c.bi is not None:
                c.bi.model.embedder.clear_cache()

    times: dict[str, list[float]] = {
        k: []
        for k in (
            "dense_first",
            "pruner_first",
            "ctx_first",
            "ctx_int8_first",
            "ctx_next",
            "ctx_one_by_one",
            "ctx_batch",
            "cross_first",
            "cross_int8_first",
            "cross_next",
            "cross_one_by_one",
            "cross_batch",
            "cross_long",
        )
    }
    for r in range(args.rounds):
        q = questions[r % len(questions)]
        fresh()
        times["dense_first"].append(timed(lambda: emb.units(doc.units) @ emb.query(q)))
        times["pruner_first"].append(timed(lambda: pruner.score(doc, q)))
        fresh()
        times["ctx_first"].append(timed(lambda: ctx.score(doc, q)))
        times["ctx_next"].append(timed(lambda: ctx.score(doc, questions[(r + 1) % len(questions)])))
        times["ctx_int8_first"].append(timed(lambda: ctx8.score(doc, q)))
        fresh()
        times["ctx_one_by_one"].append(timed(lambda: [ctx.score(doc, x) for x in batch]) / len(batch))
        fresh()
        times["ctx_batch"].append(timed(lambda: ctx.read(doc, batch)) / len(batch))
        fresh()
        times["cross_first"].append(timed(lambda: cross.read_hops(doc, [q])))
        times["cross_next"].append(timed(lambda: cross.read_hops(doc, [questions[(r + 1) % len(questions)]])))
        times["cross_int8_first"].append(timed(lambda: cross8.read_hops(doc, [q])))
        fresh()
        times["cross_one_by_one"].append(timed(lambda: [cross.read_hops(doc, [x]) for x in batch]) / len(batch))
        fresh()
        times["cross_batch"].append(timed(lambda: cross.read_hops(doc, batch)) / len(batch))
        fresh()
        times["cross_long"].append(timed(lambda: cross.read_hops(long, [q])))
    med = {k: statistics.median(v) for k, v in times.items() if v}
    pairs = {"ctx": (ctx, ctx8), "cross": (cross, cross8)}
    rr: dict[str, list[float]] = {f"{k}_{p}": [] for k in pairs for p in ("float", "int8")}
    for q in realdocs.load("val"):
        d = segment(q.text, tok)
        gold = answering_units(d, q.spans())
        for k, (f, i8) in pairs.items():
            for name, router in (("float", f), ("int8", i8)):
                rr[f"{k}_{name}"].append(1 / rank_of(router.read_hops(d, [q.question]).values[0], gold))
    out = {
        "command": "python benchmarks/ctx_speed.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "json" and v is not None),
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "load_average": list(os.getloadavg()),
        "units": len(doc.units),
        "tokens": sum(doc.lengths(tok)),
        "long_units": len(long.units),
        "long_tokens": sum(long.lengths(tok)),
        "cross_hops": cross.hops,
        "rounds": args.rounds,
        "batch": len(batch),
        "seconds": med,
        "rounds_seconds": times,
        "ratio_to_pruner_first": {k: v / med["pruner_first"] for k, v in med.items()},
        "batch_over_one_by_one": med["ctx_batch"] / med["ctx_one_by_one"],
        "cross_batch_over_one_by_one": med["cross_batch"] / med["cross_one_by_one"],
        "val_mrr": {k: statistics.mean(v) for k, v in rr.items()},
        "val_questions": len(rr["ctx_float"]),
        "goals": {
            "first_s": 0.5,
            "cross_first_s": 1.0,
            "cross_int8_first_s": 0.5,
            "cross_next_s": 0.4,
            "cross_long_s": 3.0,
            "int8_mrr_drop": 0.01,
        },
    }
    print(
        f"{len(doc.units)} units, {out['tokens']} tokens, {args.threads} thread(s), median of {args.rounds} rounds "
        f"(load {out['load_average'][0]:.1f})"
    )
    for k, v in med.items():
        print(f"  {k:<15} {v * 1000:8.1f} ms   {v / med['pruner_first']:5.2f}x the round-5 pruner's first")
    for k in pairs:
        print(
            f"  {k} val MRR: int8 {out['val_mrr'][k + '_int8']:.3f} against float {out['val_mrr'][k + '_float']:.3f} "
            f"(n={out['val_questions']})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
