"""How long ``masklab compress`` takes as a user meets it, from one interleaved run of fresh processes.

    python benchmarks/cli_start.py [--tokens 2000] [--rounds 5] [--baseline DIR] [--json benchmarks/cli_start.json]

Each round runs, in turn, one fresh ``python -m masklab`` process of each call and times it from start to
exit (wall time):

* ``help``: ``masklab compress --help``;
* ``bm25``: ``masklab compress --router bm25 --json`` on a 2,000-token file (the leading units of the
  benchmark's ``pydoc-execmodel``, the document ``benchmarks/ctx_speed.py`` times) and one of its questions;
* ``default``: the same with the default router.

Beside each wall time, the router's own seconds (``--json``'s ``router_seconds``): the rest is starting
Python, importing, loading the tokenizer and the router, reading the file and printing. Caches are warm,
as on a user's second call: one untimed call of each first (the model's de-quantised cache, the OS's file
cache), and Python's bytecode is written (``PYTHONDONTWRITEBYTECODE`` cleared, into a folder of
its own per checkout: ``PYTHONPYCACHEPREFIX``).
``--baseline DIR``: also time the same calls on the checkout in DIR (``PYTHONPATH=DIR``), interleaved in the
same rounds, so a figure is compared with the code before a change on the same machine at the same time.
Goals (issue 67): help <= 0.5 s, bm25 <= 1.5 s, the default router <= 3 s (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"help": 0.5, "bm25": 1.5, "default": 3.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000, help="the file's length in SmolLM2 tokens")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians are reported)")
    ap.add_argument("--baseline", metavar="DIR", help="also time the checkout in DIR, interleaved")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from masklab.context.router import DEFAULT_ROUTER
    from masklab.lab.tasks import realdocs
    from masklab.pretrained.models import load

    tok = load("smollm2-135m").tokenizer
    doc, questions = realdocs.speed_document(args.tokens, tok)
    text = doc.source[: doc.spans[-1][1]]
    folder = Path(tempfile.mkdtemp(prefix="cli-start-"))
    path = folder / "doc.txt"
    path.write_text(text, encoding="utf-8")
    ask = ["compress", "--context", str(path), "--question", questions[0], "--json"]
    calls = {
        "help": ["compress", "--help"],
        "bm25": [*ask, "--router", "bm25"],
        "default": ask,
    }
    trees = {"": ROOT, **({"baseline_": Path(args.baseline).resolve()} if args.baseline else {})}

    caches = {tree: tempfile.mkdtemp(prefix="cli-start-pycache-") for tree in trees.values()}

    def run(tree: Path, argv: list[str]) -> tuple[float, float | None]:
        # a user's second call reads the bytecode of the first: written, outside the checkouts
        env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "PYTHONPYCACHEPREFIX": caches[tree]}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        t0 = time.perf_counter()
        # run in the checkout: python -m puts the working folder first on sys.path, before PYTHONPATH
        out = subprocess.run(
            [sys.executable, "-m", "masklab", *argv], capture_output=True, text=True, env=env, cwd=tree
        )
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"masklab {' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()[-500:]}")
        return wall, (json.loads(out.stdout)["router_seconds"] if "--json" in argv else None)

    for prefix, tree in trees.items():  # warm: the model's cache, the file cache, the bytecode
        for argv in calls.values():
            run(tree, argv)
    load_before = list(os.getloadavg())
    wall: dict[str, list[float]] = {p + k: [] for p in trees for k in calls}
    router: dict[str, list[float]] = {p + k: [] for p in trees for k in calls if k != "help"}
    for _ in range(args.rounds):
        for key, argv in calls.items():
            for prefix, tree in trees.items():
                w, r = run(tree, argv)
                wall[prefix + key].append(w)
                if r is not None:
                    router[prefix + key].append(r)
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_router = {k: statistics.median(v) for k, v in router.items()}
    out = {
        "command": "python benchmarks/cli_start.py"
        + " ".join(f" --{k} {v}" for k, v in vars(args).items() if k != "json" and v is not None),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "shared_machine": "a 2-core machine shared with other engineers' jobs during the run: the load average "
        "below counts them; figures from an idle machine would be lower",
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        "tokens": sum(doc.lengths(tok)),
        "units": len(doc.units),
        "default_router": DEFAULT_ROUTER,
        "rounds": args.rounds,
        "commit": _commit(ROOT),
        "baseline": str(trees["baseline_"]) if args.baseline else None,
        "baseline_commit": _commit(trees["baseline_"]) if args.baseline else None,
        "wall_seconds": med,
        "router_seconds": med_router,
        "rounds_wall_seconds": wall,
        "rounds_router_seconds": router,
        "goals_s": GOALS,
        "met": {k: med[k] <= goal for k, goal in GOALS.items()},
    }
    print(
        f"{out['tokens']} tokens, {args.rounds} rounds, load {load_before[0]:.1f} -> {out['load_average_after'][0]:.1f}"
    )
    for k, v in med.items():
        extra = f"  (router {med_router[k]:.3f} s)" if k in med_router else ""
        print(f"  {k:<18} {v:7.3f} s{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def _commit(tree: Path) -> str | None:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


if __name__ == "__main__":
    raise SystemExit(main())
