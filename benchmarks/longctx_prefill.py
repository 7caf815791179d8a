"""What a router that reads the context through the LM's first layers costs, next to the
full prefill and to the prefill of a pruned context (ratios from one interleaved run).

    python benchmarks/longctx_prefill.py [--model smollm2-135m] [--lengths 512,1024] [--layers 1,2]
        [--keep 0.25] [--reps 3]

For each length n, one niah example of n tokens (masklab/lab/tasks/longctx.py) in the model's
prompt format; timed interleaved (median of ``reps``, one thread):

* ``full``: the prefill of the whole prompt (``model(ids, logits_to_keep=1)``, what
  ``generate`` pays before its first token);
* ``first<k>``: the base model's first k decoder layers over the whole prompt (no
  head): the input a first-layers router would read;
* ``pruned``: the prefill of the first ``keep`` of the prompt's tokens (what the LM pays
  after a router keeps that fraction).

Prints each time and its ratio to ``full``; ``--json PATH`` writes the rows. These decide
the router's input (issue 14: the router + pruned prefill must be >= 3x faster than full).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from masklab.util.flags import int_list  # noqa: E402
from masklab.pretrained.lm import encode  # noqa: E402
from masklab.pretrained.models import load  # noqa: E402
from masklab.lab.tasks.longctx import make_example  # noqa: E402


@contextlib.contextmanager
def first_layers(model, k: int):
    """Run only the first ``k`` decoder layers of a Hugging Face causal LM's base model."""
    base = model.model
    layers, n = base.layers, base.config.num_hidden_layers
    base.layers, base.config.num_hidden_layers = layers[:k], k
    try:
        yield base
    finally:
        base.layers, base.config.num_hidden_layers = layers, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="512,1024")
    ap.add_argument("--layers", default="1,2")
    ap.add_argument("--keep", type=float, default=0.25)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    lm = load(a.model, threads=1)
    rows = []
    with torch.no_grad():
        for n in int_list(a.lengths):
            ex = make_example("niah", n, 0, lm.tokenizer)
            ids = encode(lm, ex.sentences, ex.query).ids[None]
            pruned = ids[:, : max(1, int(a.keep * ids.shape[1]))]
            fns = {
                "full": lambda: lm.model(input_ids=ids, logits_to_keep=1),
                "pruned": lambda: lm.model(input_ids=pruned, logits_to_keep=1),
            }
            for k in int_list(a.layers):

                def run(k=k):
                    with first_layers(lm.model, k) as base:
                        base(input_ids=ids)

                fns[f"first{k}"] = run
            times = {m: [] for m in fns}
            for f in fns.values():  # warm-up
                f()
            for _ in range(a.reps):
                for m, f in fns.items():
                    t = time.perf_counter()
                    f()
                    times[m].append(time.perf_counter() - t)
            med = {m: statistics.median(v) for m, v in times.items()}
            for m, s in med.items():
                rows.append(
                    {
                        "model": a.model,
                        "tokens": int(ids.shape[1]),
                        "what": m,
                        "seconds": s,
                        "ratio_to_full": s / med["full"],
                    }
                )
                print(f"{a.model} n={ids.shape[1]:5d} {m:8s} {s:7.3f} s  x{s / med['full']:.3f} of full")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "command": "python benchmarks/longctx_prefill.py "
                    + " ".join(
                        f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if k != "json" and v is not None
                    ),
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
