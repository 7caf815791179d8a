"""Registered routers on generated tasks none of them was trained on, ranked without answering.

    python scripts/heldout_routers.py [--tasks families|longctx] [--model smollm2-135m] [--routers dense,pruner,...]
                                      [--lengths 1024,2048] [--examples 30] [--keep 0.25] [--out DIR]

``--tasks families``: the test families of ``masklab/lab/tasks/families.py`` (licence filler, date
and place templates, wording ``c``, all five kinds; the seeds ``masklab train-router --eval``
measures on). ``--tasks longctx``: the long-context tasks of ``masklab longctx`` (niah,
multikey, vt, stale; its test seeds). Each router keeps ``--keep`` of the context (filled to
it): per (kind or task, length) and pooled, the share of examples whose every gold sentence
is kept (``all_gold_kept``) and whose top sentence is gold (``gold_top``), Wilson intervals,
and for ``pruner`` an exact McNemar p against every other router on the pooled examples. The
shipped ``evidence`` router is the one ``masklab compress`` uses for ``--model``. Resumable:
finished examples are kept in ``OUT/rows-WEIGHTS.jsonl`` (WEIGHTS: a digest of every shipped
router's weights, so new weights measure again; OUT: ``results/heldout-routers-MODEL``, or
``results/longctx-routers-MODEL`` with ``--tasks longctx``); writes ``OUT/results.json`` and ``results.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import torch
from masklab.lab.routers.registry import prune_one

ROOT = Path(__file__).resolve().parent.parent
ROUTERS = "bm25,dense,bm25+dense,pruner,pruner-attention,pruner-marks,evidence,attention"
LONGCTX = ("niah", "multikey", "vt", "stale")


def digest(ex) -> str:
    """What names an example's text, so a generator change measures it again: a family
    example's own digest, else 12 hex digits of sha256 over its context and question."""
    if hasattr(ex, "digest"):
        return ex.digest
    return hashlib.sha256((ex.context + "\0" + ex.question).encode()).hexdigest()[:12]


def main() -> int:
    from masklab.lab import pipeline
    from masklab.lab.routers import load_any
    from masklab.lab.train_router import markdown, summarise
    from masklab.util.files import write_json
    from masklab.pretrained.models import load
    from masklab.lab.revision import code_hash
    from masklab.lab.stats import mcnemar
    from masklab.lab.tasks.families import split_examples
    from masklab.lab.tasks.longctx import make_examples

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tasks",
        default="families",
        choices=["families", "longctx"],
        help="the held-out test families, or the long-context tasks (module docstring)",
    )
    ap.add_argument(
        "--model",
        default="smollm2-135m",
        help="the model whose tokenizer counts tokens (and whose first layers the evidence and attention routers read)",
    )
    ap.add_argument("--routers", default=ROUTERS, help="comma-separated registered routers")
    ap.add_argument("--lengths", default="1024,2048", help="context lengths in model tokens, comma-separated")
    ap.add_argument("--examples", type=int, default=30, help="examples per kind and length")
    ap.add_argument("--keep", type=float, default=0.25, help="kept fraction of the context")
    ap.add_argument(
        "--out",
        default=None,
        help="output folder (default results/heldout-routers-MODEL, or "
        "results/longctx-routers-MODEL with --tasks longctx)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prefix = "heldout" if a.tasks == "families" else "longctx"
    out = Path(a.out or ROOT / "results" / f"{prefix}-routers-{a.model}")
    out.mkdir(parents=True, exist_ok=True)
    lm = load(a.model, threads=a.threads)
    names = tuple(a.routers.split(","))
    routers = {n: load_any(n, lm) for n in names}
    lengths = [int(n) for n in a.lengths.split(",")]
    if a.tasks == "families":
        cells = [
            (n, ex.kind, ex)
            for n in lengths
            for ex in split_examples("test", a.examples, n, seed=10_000, tokenizer=lm.tokenizer)
        ]
    else:  # seed 0: the examples `masklab longctx` answers (its routers train on other seeds)
        cells = [
            (n, t, ex)
            for n in lengths
            for t in LONGCTX
            for ex in make_examples(t, n, a.examples, seed=0, tokenizer=lm.tokenizer)
        ]
    length, kind = [n for n, _, _ in cells], [k for _, k, _ in cells]
    shipped = sorted((ROOT / "masklab" / "context" / "weights").rglob("*.safetensors"))
    weights = hashlib.sha256(b"".join(p.read_bytes() for p in shipped)).hexdigest()[:12]

    def methods(i: int, ex) -> list:
        return [
            (n, pipeline.ranked(lambda ex, r=r: prune_one(r, ex, ex.question, a.keep, fill=True)))
            for n, r in routers.items()
        ]

    def describe(i: int, ex, record: dict) -> None:
        record.update({"length": length[i], "kind": kind[i], "seed": ex.seed, "gold": ex.gold})

    def bar(items):
        if not a.progress:
            return items
        from tqdm import tqdm

        return tqdm(items, desc=f"{a.tasks} {a.model}", file=sys.stderr)

    t0, c0 = time.perf_counter(), time.process_time()
    records = pipeline.evaluate(
        [ex for _, _, ex in cells],
        methods,
        out / f"rows-{weights}.jsonl",
        key=lambda i, ex: f"{length[i]}/{kind[i]}/{ex.seed}/{digest(ex)}/{a.keep}",
        after=describe,
        progress=bar,
    )
    stale = [r["key"] for r in records if set(names) - set(r["rows"])]
    if stale:  # resumed rows of another --routers: they cannot be paired with these
        raise SystemExit(
            f"heldout_routers: {out} holds rows measured with other routers (first: {stale[0]}); name another --out"
        )
    summary = summarise(records, False, names)
    if "pruner" in names:  # paired: the pruner against each other router, every example pooled
        mine = [r["rows"]["pruner"] for r in records]
        for s in summary:
            if s["task"] == "all" and s["method"] != "pruner":
                theirs = [r["rows"][s["method"]] for r in records]
                s["p_gold_vs_pruner"] = mcnemar(
                    [x["gold_kept"] == 1 for x in mine], [x["gold_kept"] == 1 for x in theirs]
                )
                s["p_top_vs_pruner"] = mcnemar([x["gold_top"] == 1 for x in mine], [x["gold_top"] == 1 for x in theirs])
    res = {
        "command": "python scripts/heldout_routers.py " + " ".join(sys.argv[1:]),
        "model": a.model,
        "split": "test" if a.tasks == "families" else "longctx",
        "keep": a.keep,
        "weights": weights,
        "code": [code_hash("masklab.lab.pipeline")],
        "seconds": {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0},
        "summary": summary,
        "rows": records,
    }
    write_json(out / "results.json", res)
    (out / "results.md").write_text(markdown(res) + "\n")
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
