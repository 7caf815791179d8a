"""The trained ``evidence`` router on a long document, end to end, next to ``bm25`` and to one
pass of the model's first layers (ratios from one interleaved run).

    .venv/bin/python benchmarks/router_long.py [--models smollm2-135m,gemma3-270m] [--rounds 3]
        [--out benchmarks/router_long.json]

The document is the GPL version 3 (``/usr/share/common-licenses/GPL-3``, or
``masklab/data/realdocs/docs/gpl-3.txt`` where present; about 7,500 tokens, one router
window of either packaged model), the question "Can I charge money for copies?". Per model
and round, in an order that rotates from round to round, one torch thread:

* ``bm25`` and ``evidence``: ``masklab compress --router R --json --no-progress`` in a fresh
  process of this checkout (wall and CPU seconds of the whole command: start-up, model
  load, segmenting, scoring; the ``router_seconds`` it prints beside them);
* ``first_layers``: one pass of the model's first ``layers`` layers (the shipped router's)
  over the router's input (question and document), in this process, as the router runs it
  (:func:`masklab.pretrained.arch.first_layers`);
* ``first_layers_masked``: the same pass on transformers' own SDPA path, which builds a
  ``(T, T)`` mask per layer type (what the router ran before ``first_layers`` switched to
  :func:`masklab.pretrained.arch.causal_attention`).

The goal (issue: the trained router on long documents) is ``evidence <= 2 x bm25 +
first_layers``; ``ratio`` is ``sum(evidence) / sum(2 x bm25 + first_layers)`` over the rounds
(wall seconds; ``ratio_cpu`` on CPU seconds), with a paired bootstrap 95% interval over rounds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from masklab.util.files import write_json  # noqa: E402
from masklab.lab.stats import bootstrap_ratio  # noqa: E402

QUESTION = "Can I charge money for copies?"
DOCUMENTS = (ROOT / "masklab/data/realdocs/docs/gpl-3.txt", Path("/usr/share/common-licenses/GPL-3"))


def document() -> Path:
    for path in DOCUMENTS:
        if path.is_file():
            return path
    raise SystemExit(f"no GPL-3 text at {' or '.join(map(str, DOCUMENTS))}")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def compress(model: str, router: str, doc: Path) -> dict:
    """One ``masklab compress`` process: wall and CPU seconds, and what it printed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "masklab",
        "compress",
        "--context",
        str(doc),
        "--question",
        QUESTION,
        "--router",
        router,
        "--model",
        model,
        "--json",
        "--no-progress",
        "--device",
        "cpu",
        "--threads",
        "1",
    ]
    t0, c0 = time.perf_counter(), children_cpu()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu() - c0
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    res = json.loads(out.stdout)
    return {
        "s": wall,
        "cpu_s": cpu,
        "router_s": res["router_seconds"],
        "tokens": res["context_tokens"],
        "units": len(res["units"]),
        "notes": res["notes"],
    }


def passes(lm, doc: Path, layers: int):
    """``{name: () -> None}``: one first-layers pass over the router's input, the fast way
    and transformers' masked way."""
    from masklab.text.document import segment
    from masklab.context.routers.features import router_input
    from masklab.pretrained import arch

    units = segment(doc.read_text(encoding="utf-8"), lm.tokenizer).units
    ids, _ = router_input(lm.tokenizer, units, QUESTION)
    ids = ids[None]

    @torch.no_grad()
    def fast() -> None:
        with arch.first_layers(lm.model, layers) as base:
            base(input_ids=ids, use_cache=False, output_hidden_states=True)

    @torch.no_grad()
    def masked() -> None:
        real = arch._fast_pass
        arch._fast_pass = lambda model: False
        try:
            fast()
        finally:
            arch._fast_pass = real

    return {"first_layers": fast, "first_layers_masked": masked}, int(ids.shape[1])


def timed(f) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    f()
    return {"s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def measure(model: str, rounds: int, doc: Path) -> dict:
    from masklab.context.routers.trained import shipped
    from masklab.util.files import read_json
    from masklab.pretrained.models import load

    meta = read_json(shipped(model).with_suffix(".json"))
    lm = load(model, threads=1)
    fns, router_tokens = passes(lm, doc, int(meta["layers"]))
    steps = {
        "bm25": lambda: compress(model, "bm25", doc),
        "evidence": lambda: compress(model, "evidence", doc),
        **{k: (lambda f=f: timed(f)) for k, f in fns.items()},
    }
    compress(model, "bm25", doc)  # warm-up: file caches, the model's cache folder
    fns["first_layers"]()
    rows = []
    for r in range(rounds):
        names = list(steps)
        names = names[r % len(names) :] + names[: r % len(names)]
        row = {"round": r, "order": names}
        for name in names:
            row[name] = steps[name]()
        rows.append(row)
        print(
            f"{model} round {r + 1}/{rounds}: " + ", ".join(f"{n} {row[n]['s']:.2f} s" for n in steps),
            file=sys.stderr,
            flush=True,
        )

    def goal(key: str) -> list[float]:
        return [2 * row["bm25"][key] + row["first_layers"][key] for row in rows]

    ev = [row["evidence"]["s"] for row in rows]
    ev_cpu = [row["evidence"]["cpu_s"] for row in rows]
    lo, hi = bootstrap_ratio(ev, goal("s"))
    lo_cpu, hi_cpu = bootstrap_ratio(ev_cpu, goal("cpu_s"))

    def mean(name: str, key: str = "s") -> float:
        return sum(row[name][key] for row in rows) / len(rows)

    return {
        "features": meta["features"],
        "layers": meta["layers"],
        "context_tokens": rows[0]["evidence"]["tokens"],
        "router_tokens": router_tokens,
        "units": rows[0]["evidence"]["units"],
        "notes": rows[0]["evidence"]["notes"],
        "seconds": {n: mean(n) for n in steps},
        "cpu_seconds": {n: mean(n, "cpu_s") for n in steps},
        "router_seconds": {n: mean(n, "router_s") for n in ("bm25", "evidence")},
        "masked_over_fast_pass": mean("first_layers_masked") / mean("first_layers"),
        "ratio": sum(ev) / sum(goal("s")),
        "ratio_lo": lo,
        "ratio_hi": hi,
        "ratio_cpu": sum(ev_cpu) / sum(goal("cpu_s")),
        "ratio_cpu_lo": lo_cpu,
        "ratio_cpu_hi": hi_cpu,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m", help="comma-separated packaged models")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per model")
    ap.add_argument("--out", default="benchmarks/router_long.json", help="the JSON written")
    args = ap.parse_args()
    torch.set_num_threads(1)
    doc = document()
    text = doc.read_bytes()
    t0 = time.perf_counter()
    res = {
        "command": "python benchmarks/router_long.py " + " ".join(sys.argv[1:]),
        "question": QUESTION,
        "document": {"path": str(doc), "sha256": hashlib.sha256(text).hexdigest()[:12], "bytes": len(text)},
        "rounds": args.rounds,
        "models": {},
    }
    for m in args.models.split(","):  # written after each model: a stopped run keeps the models it finished
        res["models"][m] = measure(m, args.rounds, doc)
        res["wall_s"] = time.perf_counter() - t0
        write_json(Path(args.out), res)
    for m, r in res["models"].items():
        s = r["seconds"]
        print(
            f"{m} ({r['context_tokens']} tokens): bm25 {s['bm25']:.2f} s, evidence {s['evidence']:.2f} s, first "
            f"{r['layers']} layer(s) {s['first_layers']:.2f} s (masked SDPA {s['first_layers_masked']:.2f} s); "
            f"evidence / (2 bm25 + pass) {r['ratio']:.2f} [{r['ratio_lo']:.2f}, {r['ratio_hi']:.2f}], "
            f"CPU {r['ratio_cpu']:.2f} [{r['ratio_cpu_lo']:.2f}, {r['ratio_cpu_hi']:.2f}]"
        )


if __name__ == "__main__":
    main()
