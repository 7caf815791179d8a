"""What a causal evidence label costs, with and without the cached prefix.

``masklab train-router`` labels each training example by group testing under key masks
(:func:`masklab.lab.linear_routers.make_labels`). A variant that hides units from token ``p``
on reads tokens ``0..p-1`` exactly as the full context does, so their keys and values can
come from one cached pass (``reuse_prefix``). This labels the same training examples (the
``train`` split, the shipped routers' length of 256 tokens) both ways, interleaved per
example (which way goes first alternates), one torch thread, and records per example the
CPU seconds, passes and labels of each way. The labels must agree; the speed-up is
``sum(CPU-s without) / sum(CPU-s with)`` over all examples (a wrong answer costs its
generation and gets no labels, as in training), with a paired bootstrap 95% interval.

    .venv/bin/python benchmarks/label_cost.py [--models smollm2-135m,gemma3-270m] [--per-kind 8]
        [--out benchmarks/label_cost.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from masklab.lab.linear_routers import make_labels  # noqa: E402
from masklab.util.files import write_json  # noqa: E402
from masklab.pretrained.models import load  # noqa: E402
from masklab.lab.stats import bootstrap_ratio  # noqa: E402
from masklab.lab.tasks.families import split_examples  # noqa: E402

WAYS = {"full reads": False, "cached prefix": True}


def measure(model: str, per_kind: int, length: int) -> dict:
    lm = load(model, threads=1)
    examples = split_examples("train", per_kind, length, tokenizer=lm.tokenizer)
    rows = []
    for i, ex in enumerate(examples):
        order = list(WAYS.items()) if i % 2 == 0 else list(WAYS.items())[::-1]
        row = {"kind": ex.kind, "example": ex.digest}
        for name, reuse in order:
            t0, c0 = time.perf_counter(), time.process_time()
            lab = make_labels(lm, ex, ex.query, accept=ex.is_correct, reuse_prefix=reuse)
            row[name] = {
                "seconds": time.perf_counter() - t0,
                "cpu_s": time.process_time() - c0,
                "passes": lab["passes"],
                "correct": lab["correct"],
                "evidence": lab["evidence"],
                "attention": lab["attention"],
            }
        rows.append(row)
        print(
            f"{model} {i + 1}/{len(examples)} {ex.kind}: "
            + ", ".join(f"{n} {row[n]['cpu_s']:.1f} CPU-s" for n in WAYS),
            file=sys.stderr,
            flush=True,
        )
    labelled = [r for r in rows if r["full reads"]["correct"]]
    off = [r["full reads"]["cpu_s"] for r in rows]
    on = [r["cached prefix"]["cpu_s"] for r in rows]
    lo, hi = bootstrap_ratio(off, on)
    return {
        "examples": len(rows),
        "labelled": len(labelled),  # a wrong answer costs its generation, no labels
        "same_evidence": sum(r["full reads"]["evidence"] == r["cached prefix"]["evidence"] for r in rows),
        "same_attention": sum(r["full reads"]["attention"] == r["cached prefix"]["attention"] for r in rows),
        **agreement(rows),
        "passes_per_labelled": sum(r["full reads"]["passes"] for r in rows) / max(1, len(labelled)),
        "cpu_s_per_labelled": {n: sum(r[n]["cpu_s"] for r in rows) / max(1, len(labelled)) for n in WAYS},
        "speedup": sum(off) / sum(on),
        "speedup_lo": lo,
        "speedup_hi": hi,
        "rows": rows,
    }


def agreement(rows: list[dict]) -> dict:
    """How often the two ways agree among the examples that carry a label on either side
    (two unlabelled examples agree trivially, so ``same_*`` over all examples overstates it):
    ``labelled_either``, ``same_evidence_labelled``, ``same_attention_labelled``."""
    both = [r for r in rows if any(r[n]["evidence"] is not None or r[n]["attention"] is not None for n in WAYS)]
    return {
        "labelled_either": len(both),
        "same_evidence_labelled": sum(r["full reads"]["evidence"] == r["cached prefix"]["evidence"] for r in both),
        "same_attention_labelled": sum(r["full reads"]["attention"] == r["cached prefix"]["attention"] for r in both),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m", help="comma-separated packaged models")
    ap.add_argument("--per-kind", type=int, default=8, help="training examples per task kind (4 kinds)")
    ap.add_argument("--length", type=int, default=256, help="context length in model tokens")
    ap.add_argument("--out", default="benchmarks/label_cost.json", help="the JSON written")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    res = {"command": "python benchmarks/label_cost.py " + " ".join(sys.argv[1:]), "length": args.length, "models": {}}
    for m in args.models.split(","):  # written after each model: a stopped run keeps the models it finished
        res["models"][m] = measure(m, args.per_kind, args.length)
        res["wall_s"] = time.perf_counter() - t0
        write_json(Path(args.out), res)
    for m, r in res["models"].items():
        print(
            f"{m}: {r['labelled']} of {r['examples']} labelled, the same evidence / attention labels "
            f"{r['same_evidence_labelled']} / {r['same_attention_labelled']} "
            f"of the {r['labelled_either']} labelled on either side, "
            f"CPU-s per labelled {r['cpu_s_per_labelled']['full reads']:.1f} "
            f"-> {r['cpu_s_per_labelled']['cached prefix']:.1f}, "
            f"{r['speedup']:.2f}x [{r['speedup_lo']:.2f}, {r['speedup_hi']:.2f}]"
        )


if __name__ == "__main__":
    main()
