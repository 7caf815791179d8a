"""What routing with a small model costs next to the answering model's prefill (issue: route
with a small model, answer with any model): ratios from one interleaved run.

    .venv/bin/python benchmarks/router_model_cost.py [--tokens 2048] [--rounds 5]
        [--out benchmarks/router_model_cost.json]

A context of ``--tokens`` tokens (the start of the GPL version 3 text of the real-document
benchmark, cut at a unit boundary) and one question. Per ordered pair (ranking model,
answering model) of the packaged models and per round, in an order that rotates from round
to round, one torch thread:

* ``router``: the ``evidence`` router's ``score`` with ``router_model=`` the ranking model
  (its first layers and its router; segmenting excluded, as ``router_seconds`` is);
* ``prefill``: the answering model's prefill of the same context and question
  (:func:`masklab.context.answer.generate_answer` with one new token: tokenise, prefill and
  one greedy step).

``share`` is ``sum(router) / sum(prefill)`` over the rounds, with a paired bootstrap 95%
interval; the goal is a share of at most 0.1 at 2k tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from masklab.util.files import write_json  # noqa: E402
from masklab.lab.stats import bootstrap_ratio  # noqa: E402

QUESTION = "Can I charge money for copies?"
MODELS = ("smollm2-135m", "gemma3-270m")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tokens", type=int, default=2048, help="context tokens, counted by the answering model (default 2048)"
    )
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/router_model_cost.json"), help="output JSON")
    a = ap.parse_args()
    import torch

    from masklab.context.answer import generate_answer
    from masklab.text.document import Document, segment
    from masklab.context.routers import load_router
    from masklab.pretrained.models import load

    torch.set_num_threads(1)
    text = (ROOT / "masklab/data/realdocs/docs/gpl-3.txt").read_text(encoding="utf-8")
    lms = {m: load(m, threads=1) for m in MODELS}
    out = {
        "command": "python benchmarks/router_model_cost.py " + " ".join(sys.argv[1:]),
        "tokens": a.tokens,
        "rounds": a.rounds,
        "machine": "the shared 2-core CPU machine, one torch thread",
        "pairs": {},
    }
    for answerer in MODELS:
        lm = lms[answerer]
        full = segment(text, lm.tokenizer)
        lengths, n, used = full.lengths(lm.tokenizer), 0, 0
        while n < len(lengths) and used + lengths[n] <= a.tokens:
            used += lengths[n]
            n += 1
        doc = Document(units=full.units[:n])
        query = f"\nQuestion: {QUESTION}\nAnswer:"
        for ranker in MODELS:
            router = load_router("evidence", lm, router_model=ranker)
            steps = {
                "router": lambda: router.score(doc, QUESTION),
                "prefill": lambda: generate_answer(lm, doc.units, query, 1),
            }
            for f in steps.values():
                f()  # warm-up
            rows = []
            for r in range(a.rounds):
                names = list(steps)[r % 2 :] + list(steps)[: r % 2]
                row = {}
                for name in names:
                    t0 = time.perf_counter()
                    steps[name]()
                    row[name] = time.perf_counter() - t0
                rows.append(row)
            rt, pf = [r["router"] for r in rows], [r["prefill"] for r in rows]
            lo, hi = bootstrap_ratio(rt, pf)
            key = f"{ranker}->{answerer}"
            out["pairs"][key] = {
                "ranking_model": ranker,
                "answering_model": answerer,
                "context_tokens": used,
                "router_s": sum(rt) / len(rt),
                "prefill_s": sum(pf) / len(pf),
                "share": sum(rt) / sum(pf),
                "share_lo": lo,
                "share_hi": hi,
                "rounds": rows,
            }
            print(
                f"{key}: router {sum(rt) / len(rt):.2f} s, prefill {sum(pf) / len(pf):.2f} s, share "
                f"{sum(rt) / sum(pf):.3f} [{lo:.3f}, {hi:.3f}]",
                file=sys.stderr,
                flush=True,
            )
    write_json(Path(a.out), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
