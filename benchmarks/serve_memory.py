"""Where ``masklab serve``'s resident memory goes: distinct documents against repeated ones,
with and without returning the allocator's free memory (``malloc_trim``) after each request.

    python benchmarks/serve_memory.py [--documents 150] [--json docs/results/serve_memory.json]

Each variant runs in a fresh process: SmolLM2's tokenizer and masklab's default router, a
:class:`masklab.context.serve.Service` (the server's own worker thread and code path, no
HTTP), and ``--documents`` requests of ``--paragraphs`` paragraphs drawn from
``masklab/data/realdocs/docs/*.txt``:

* ``distinct``: a new document each time (every request embeds its units);
* ``repeated``: the same document, a new question each time (the embedder's cache hits).

Recorded every ``--every`` requests: the resident memory (``/proc``), the bytes the
embedder's cache holds, and the Python heap as :mod:`tracemalloc` counts it (what Python
objects hold; tensors' and the tokenizer's buffers are C allocations it does not see).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "distinct_no_trim": ("distinct", False),
    "distinct_trim": ("distinct", True),
    "repeated_no_trim": ("repeated", False),
}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_variant(mode: str, trim: bool, documents: int, paragraphs: int, every: int, seed: int) -> dict:
    sys.path.insert(0, str(ROOT))
    import tracemalloc

    import torch

    from masklab.context import serve
    from masklab.context.router import DEFAULT_ROUTER
    from masklab.pretrained.models import load

    torch.set_num_threads(1)
    texts = [p.read_text() for p in sorted((ROOT / "masklab/data/realdocs/docs").glob("*.txt"))]
    paras = [p.strip() for t in texts for p in t.split("\n\n") if len(p.strip()) > 40]
    rng = random.Random(seed)
    cfg = serve.ServeConfig(trim=trim)
    service = serve.Service(load(cfg.model, threads=1), cfg)
    service.run(torch.set_num_threads, 1).result()
    service.run(service.router, cfg.router).result()
    fixed = "\n\n".join(rng.sample(paras, paragraphs))
    tracemalloc.start()
    rows, t0 = [], time.perf_counter()
    for i in range(documents):
        text = fixed if mode == "repeated" else f"Record {i}.\n\n" + "\n\n".join(rng.sample(paras, paragraphs))
        body = {"context": text, "question": f"What does it say about item {i}?", "keep": 0.25}
        req = serve.parse_request(json.dumps(body).encode(), cfg)
        service.submit(req, float("inf")).future.result()
        if i % every == 0 or i == documents - 1:
            cache = [e.cache_stats() for e in serve_embedders() if e.misses]
            rows.append(
                {
                    "requests": i + 1,
                    "rss_mb": round(rss_mb(), 1),
                    "cache_mb": round(sum(c["bytes"] for c in cache) / 2**20, 2),
                    "python_heap_mb": round(tracemalloc.get_traced_memory()[0] / 2**20, 2),
                }
            )
    service.close()
    first, last = rows[0], rows[-1]
    return {
        "mode": mode,
        "trim": trim,
        "router": DEFAULT_ROUTER,
        "documents": documents,
        "paragraphs": paragraphs,
        "seconds": time.perf_counter() - t0,
        "rows": rows,
        "rss_growth_mb": round(last["rss_mb"] - first["rss_mb"], 1),
        "cache_growth_mb": round(last["cache_mb"] - first["cache_mb"], 2),
        "python_heap_growth_mb": round(last["python_heap_mb"] - first["python_heap_mb"], 2),
    }


def serve_embedders():
    from masklab.context.embedder import live_embedders

    return live_embedders()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=int, default=150, help="requests per variant (default 150)")
    ap.add_argument("--paragraphs", type=int, default=25, help="paragraphs per document (default 25)")
    ap.add_argument("--every", type=int, default=10, help="record every this many requests (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # (one variant, in its own process)
    a = ap.parse_args()
    if a.documents < 1 or a.paragraphs < 1 or a.every < 1:
        raise SystemExit("serve_memory: --documents, --paragraphs and --every must be positive")
    if a.variant:
        mode, trim = VARIANTS[a.variant]
        print(json.dumps(run_variant(mode, trim, a.documents, a.paragraphs, a.every, a.seed)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    sys.path.insert(0, str(ROOT))
    from masklab.lab import revision

    out = {
        "command": "python benchmarks/serve_memory.py " + " ".join(sys.argv[1:]),
        "code": revision.code_hash("masklab.context.serve"),
        "code_ast": revision.code_ast("masklab.context.serve"),
        "git_rev": revision.git_rev(),
        "machine": f"{os.cpu_count()} CPU cores shared with other jobs; one torch thread",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "variants": {},
    }
    for name in VARIANTS:
        p = subprocess.run(
            [
                sys.executable,
                __file__,
                "--variant",
                name,
                "--documents",
                str(a.documents),
                "--paragraphs",
                str(a.paragraphs),
                "--every",
                str(a.every),
                "--seed",
                str(a.seed),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if p.returncode != 0:
            raise SystemExit(f"serve_memory: variant {name!r} failed:\n{p.stderr[-2000:]}")
        out["variants"][name] = json.loads(p.stdout.strip().splitlines()[-1])
        v = out["variants"][name]
        print(
            f"{name}: RSS +{v['rss_growth_mb']} MiB, cache +{v['cache_growth_mb']} MiB, python heap "
            f"+{v['python_heap_growth_mb']} MiB over {v['documents']} requests ({v['seconds']:.0f} s)",
            flush=True,
        )
        if a.json:  # after every variant: a killed run keeps what it finished
            Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
