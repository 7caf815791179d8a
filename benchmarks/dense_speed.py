"""The dense router's speed against bm25's, as ratios from one interleaved run.

    python benchmarks/dense_speed.py [--tokens 2000] [--rounds 15] [--threads 1] [--json benchmarks/dense_speed.json]

A real document (``pydoc-execmodel`` of the second test split, its leading units up to
``--tokens`` SmolLM2 tokens) and the benchmark's questions about it. Each round, in turn:

* ``embed``: the document's units embedded with the cache emptied (the first question on a document);
* ``query``: one question scored on the embedded document (a cache hit: the question's embedding
  and one matrix-vector product);
* ``bm25``: one question scored by ``bm25`` (its index is built per call);
* ``pruner_first``: the shipped pruner's first question on the document (its encoder's cache
  emptied: the adapted encoder embeds the units, as ``embed`` does for ``dense``);
* ``pruner``: one more question scored by the shipped pruner on the document it has embedded;
* the same two dense steps with the encoder's linear layers in int8 (``--int8``'s
  :func:`~masklab.context.embedder.int8_linears`), and how far that moves the units' ranking (Spearman's
  rho of the scores, the top-10 overlap, and the MRR on the benchmark's val split against fp32's).

Medians over rounds; goals: embed <= 0.5 s, query <= 20 ms, the pruner <= 0.3 s per question (its
first on a document too), on one thread of this CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000, help="document length in SmolLM2 tokens")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds (medians are reported)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import copy

    from scipy.stats import spearmanr

    from masklab.context.embedder import load_embedder
    from masklab.context.routers.bm25 import BM25
    from masklab.text.document import segment
    from masklab.context.embedder import int8_linears
    from masklab.pretrained.models import load
    from masklab.lab.tasks import realdocs

    tok = load("smollm2-135m", threads=args.threads).tokenizer
    doc, questions = realdocs.speed_document(args.tokens, tok)
    units = doc.units
    fp32 = load_embedder()
    int8 = copy.copy(fp32)  # fp32 is the shared embedder (load_embedder) that dense and bm25+dense read
    int8.model = int8_linears(copy.deepcopy(fp32.model))
    int8._cache = type(fp32._cache)()
    bm25 = BM25()
    from masklab.context.routers import load_router

    pruner = load_router("pruner")

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out

    times: dict[str, list[float]] = {
        k: [] for k in ("embed", "query", "pruner_first", "pruner", "embed_int8", "query_int8", "bm25")
    }
    for r in range(args.rounds):
        q = questions[r % len(questions)]
        for name, emb in (("", fp32), ("_int8", int8)):
            emb._cache.clear()
            times["embed" + name].append(timed(lambda: emb.units(units))[0])
            times["query" + name].append(timed(lambda: emb.units(units) @ emb.query(q))[0])
            if not name:
                pruner.model.embedder._cache.clear()
                times["pruner_first"].append(timed(lambda: pruner.score(doc, q))[0])
                times["pruner"].append(timed(lambda: pruner.score(doc, q))[0])
        times["bm25"].append(timed(lambda: bm25.score(doc, q))[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    a, b = fp32.units(units), int8.units(units)
    rho, top = [], []
    for q in questions:
        sa, sb = a @ fp32.query(q), b @ int8.query(q)
        rho.append(float(spearmanr(sa.numpy(), sb.numpy())[0]))
        top.append(len(set(sa.topk(10).indices.tolist()) & set(sb.topk(10).indices.tolist())) / 10)
    from masklab.lab.realdocs import answering_units, rank_of

    val_rr: dict[str, list[float]] = {"fp32": [], "int8": []}  # the ranking change where it is measured: val MRR
    for q in realdocs.load("val"):
        d = segment(q.text, tok)
        gold = answering_units(d, q.spans())
        for name, emb in (("fp32", fp32), ("int8", int8)):
            val_rr[name].append(1 / rank_of(emb.units(d.units) @ emb.query(q.question), gold))
    out = {
        "command": "python benchmarks/dense_speed.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "json" and v is not None),
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "units": len(units),
        "tokens": sum(doc.lengths(tok)),
        "questions": len(questions),
        "rounds": args.rounds,
        "seconds": med,
        "ratio_to_bm25": {k: v / med["bm25"] for k, v in med.items()},
        "int8_spearman": statistics.mean(rho),
        "int8_top10_overlap": statistics.mean(top),
        "val_mrr": {k: statistics.mean(v) for k, v in val_rr.items()},
        "val_questions": len(val_rr["fp32"]),
        "goals": {"embed_s": 0.5, "query_s": 0.02, "pruner_s": 0.3, "pruner_first_s": 0.3},
    }
    print(f"{len(units)} units, {out['tokens']} tokens, {args.threads} thread(s), median of {args.rounds} rounds")
    for k, v in med.items():
        print(f"  {k:<11} {v * 1000:8.1f} ms   {v / med['bm25']:6.1f}x bm25")
    print(
        f"  int8 vs fp32: Spearman {out['int8_spearman']:.3f}, top-10 overlap {out['int8_top10_overlap']:.2f}, "
        f"val MRR {out['val_mrr']['int8']:.3f} against {out['val_mrr']['fp32']:.3f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
