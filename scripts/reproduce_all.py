"""Run every reproduction (and factor sweep) whose numbers README.md and docs/ quote, into
``results/NAME``, and record each invocation's wall and CPU time in ``results/NAME/wall.json``.

    python scripts/reproduce_all.py                       # all of them, in the order below
    python scripts/reproduce_all.py gotu evidence --jobs 2
    python scripts/reproduce_all.py longctx-peers --keep-old-runs   # a task added: the finished ones kept
    masklab report                                        # then regenerate the docs' tables

A reproduction resumes: runs already in ``results/NAME`` that the same code made are kept
(:mod:`masklab.revision`), so an interrupted call, or a call after an edit to one study,
redoes only what is missing or stale. Each call appends one entry to ``wall.json`` (wall
seconds, CPU seconds of the child processes, load average at the start, exit code), so the
time a table cost is the sum of its entries.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from masklab.files import read_json, write_json  # noqa: E402

# (name, the masklab arguments); results land in results/NAME
REPRODUCTIONS = [
    ("gotu", ["reproduce", "gotu"]),
    ("evidence", ["reproduce", "evidence"]),
    ("routing", ["reproduce", "routing"]),
    ("vision", ["reproduce", "vision"]),
    ("lm", ["reproduce", "lm"]),
    ("arith", ["reproduce", "arith"]),
    ("gotu-designs", ["sweep", "gotu-designs", "--seeds", "1"]),
    ("routing-targets", ["sweep", "routing-targets"]),
    ("pretrained", ["reproduce", "pretrained"]),
    ("tune-prior", ["reproduce", "tune-prior"]),
    ("longctx", ["reproduce", "longctx"]),
    ("evidence-prior", ["reproduce", "evidence-prior"]),
    # the question-aware peers at 1024 tokens, 30 examples per cell, with the shipped routers (docs/context.md)
    ("longctx-peers", ["longctx", "--model", "smollm2-135m", "--tasks", "niah,multikey,multivalue,vt,stale", "--length", "1024",
                       "--keep", "0.25", "--examples", "30", "--routers", "lexical,bm25,longllmlingua,evidence",
                       "--router-source", "shipped", "--compare", "snapkv,snapkv-question,finch"]),
    # the same on Gemma 3 270M (multivalue apart, below)
    ("longctx-peers-gemma", ["longctx", "--model", "gemma3-270m", "--tasks", "niah,multikey,vt,stale", "--length", "1024",
                             "--keep", "0.25", "--examples", "30", "--routers", "lexical,bm25,longllmlingua,evidence",
                             "--router-source", "shipped", "--compare", "snapkv,snapkv-question,finch"]),
    # Gemma's multivalue at 1024 tokens: two seeds of 15 examples, so two cores share one task
    ("longctx-peers-gemma-multivalue", ["longctx", "--model", "gemma3-270m", "--tasks", "multivalue", "--length", "1024",
                                        "--keep", "0.25", "--examples", "15", "--seeds", "2", "--routers",
                                        "lexical,bm25,longllmlingua,evidence", "--router-source", "shipped",
                                        "--compare", "snapkv,snapkv-question,finch"]),
    # Gemma answering, SmolLM2's router ranking (--router-model), on the tasks where Gemma's full context scores >= 0.5
    ("longctx-gemma-via-smollm2", ["longctx", "--model", "gemma3-270m", "--tasks", "niah,multikey,stale", "--length", "1024",
                                   "--keep", "0.25", "--examples", "30", "--evidence", "0", "--routers", "evidence,bm25",
                                   "--router-source", "shipped", "--router-model", "smollm2-135m", "--compare", "none"]),
    # Gemma's shipped router since the hop feature (v4-hop) on the same 1024-token examples, against the full context
    ("longctx-gemma-hop", ["longctx", "--model", "gemma3-270m", "--tasks", "niah,multikey,vt,stale,multivalue", "--length",
                           "1024", "--keep", "0.25", "--examples", "30", "--routers", "evidence", "--router-source", "shipped",
                           "--compare", "none"]),
    # where pruning pays: 4096 tokens, the shipped routers and the word-overlap peers (one entry per model: each fits a session)
    ("longctx-4k", ["longctx", "--model", "smollm2-135m", "--tasks", "niah,stale", "--length", "4096",
                    "--keep", "0.25", "--examples", "20", "--routers", "lexical,bm25,evidence",
                    "--router-source", "shipped", "--compare", "none"]),
    ("longctx-4k-gemma", ["longctx", "--model", "gemma3-270m", "--tasks", "niah,stale", "--length", "4096",
                          "--keep", "0.25", "--examples", "20", "--routers", "lexical,bm25,evidence",
                          "--router-source", "shipped", "--compare", "none"]),
    # Gemma's shipped router since the hop feature at 4096 tokens, the same examples, against the full context
    ("longctx-4k-gemma-hop", ["longctx", "--model", "gemma3-270m", "--tasks", "niah,stale", "--length", "4096",
                              "--keep", "0.25", "--examples", "20", "--routers", "evidence", "--router-source", "shipped",
                              "--compare", "none"]),
    # the smaller runs the docs quote, each with the arguments its results.json records (--out, --jobs and
    # --no-progress apart, which run() adds)
    ("ep-arith-p20", ["evidence-prior", "--task", "arith", "--probe-fraction", "0.2", "--method", "mask-derived,mask-shuffled", "--seeds", "1"]),
    ("ep-arith-p30", ["evidence-prior", "--task", "arith", "--probe-fraction", "0.3", "--method", "mask-derived,mask-shuffled", "--seeds", "1"]),
    ("ep-arith-top4", ["evidence-prior", "--task", "arith", "--top-k", "4", "--method", "mask-derived,mask-shuffled", "--seeds", "1"]),
    ("ep-derive-drop", ["evidence-prior", "--derive-only", "--unidentifiable", "drop", "--task", "cyclic3,maj3,2parity"]),
    ("ep-derive-probe", ["evidence-prior", "--derive-only", "--source", "probe", "--steps", "600", "--task", "cyclic3,maj3,2parity"]),
    ("ep-lm-top16", ["evidence-prior", "--task", "lm", "--top-k", "16", "--method", "mask-derived,mask-shuffled", "--seeds", "1"]),
    ("ep-maj3-drop", ["evidence-prior", "--task", "maj3", "--unidentifiable", "drop", "--method", "mask-derived,mask-shuffled", "--seeds", "3"]),
    ("ep-vision-top9", ["evidence-prior", "--task", "vision", "--top-k", "9", "--method", "mask-derived,mask-shuffled", "--seeds", "1"]),
    ("ev-aggregate-seeds", ["evidence", "--task", "aggregate", "--seeds", "3"]),
    ("ev-h3-aux", ["evidence", "--task", "multihop", "--hops", "3", "--teacher-steps", "3000", "--aux", "1"]),
    ("ev-h3-seeds", ["evidence", "--task", "multihop", "--hops", "3", "--seeds", "3"]),
    ("ev-quick", ["evidence", "--quick"]),
    ("ev-stale-3k", ["evidence", "--task", "stale", "--teacher-steps", "3000", "--recency", "none"]),
    ("ev-stale-3k-rec", ["evidence", "--task", "stale", "--teacher-steps", "3000", "--recency", "stale"]),
    ("ev-stale-6k", ["evidence", "--task", "stale", "--teacher-steps", "6000", "--recency", "none"]),
    ("ev-stale-seeds", ["evidence", "--task", "stale", "--seeds", "3"]),
    ("ev-untrained", ["evidence", "--task", "multihop", "--quick", "--items", "16"]),
    ("lm-nopos", ["lm", "--method", "mask-nopos", "--seeds", "3"]),
    ("longctx-quick", ["longctx", "--quick"]),
    ("routing-d2h2", ["routing", "--task", "multihop", "--hops", "2,3", "--targets", "gold", "--independent", "none", "--baselines", "none", "--router-depth", "2", "--router-heads", "2", "--seeds", "3"]),
    ("routing-d2h4", ["routing", "--task", "multihop", "--hops", "2,3", "--targets", "gold", "--independent", "none", "--baselines", "none", "--router-depth", "2", "--router-heads", "4", "--seeds", "3"]),
    ("routing-nols", ["routing", "--task", "multihop", "--hops", "2", "--targets", "gold,causal", "--independent", "none", "--baselines", "dense", "--no-length-scale", "--seeds", "3"]),
    ("tune-prior-lora-lr01", ["tune-prior", "--method", "lora", "--lora-lr", "0.01", "--train-prompts", "200", "--test-prompts", "50", "--steps", "100", "--ppl-tokens", "256"]),
    # about 6.5 CPU-hours (benchmarks/arith_size_cost.json), 84% of it at x4: last
    ("arith-size", ["sweep", "arith-size"]),
]


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(name: str, args: list[str], jobs: int, keep_old_runs: bool = False) -> int:
    out = ROOT / "results" / name
    cmd = [sys.executable, "-m", "masklab", *args, "--out", str(out.relative_to(ROOT)), "--jobs", str(jobs), "--no-progress"]
    cmd += ["--keep-old-runs"] if keep_old_runs else []
    print(f"== {name}: {' '.join(cmd[2:])}", flush=True)
    load, started = os.getloadavg()[0], time.strftime("%Y-%m-%dT%H:%M:%S%z")
    start, cpu0 = time.perf_counter(), cpu_seconds()
    rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}).returncode
    entry = {
        "command": "masklab " + " ".join(cmd[3:]),
        "started": started,
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu_s": round(cpu_seconds() - cpu0, 1),
        "load_at_start": round(load, 2),
        "cpus": os.cpu_count(),
        "rc": rc,
    }
    path = out / "wall.json"
    log = read_json(path) if path.exists() else {"invocations": []}
    log["invocations"].append(entry)
    log["wall_s_total"] = round(sum(e["wall_s"] for e in log["invocations"]), 1)
    log["cpu_s_total"] = round(sum(e["cpu_s"] for e in log["invocations"]), 1)
    out.mkdir(parents=True, exist_ok=True)
    write_json(path, log)
    print(f"== {name}: rc {rc}, {entry['wall_s']:.0f} s wall, {entry['cpu_s']:.0f} s CPU", flush=True)
    return rc


def main() -> int:
    names = [n for n, _ in REPRODUCTIONS]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"which to run (default all: {', '.join(names)})")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel per reproduction (default 2)")
    ap.add_argument("--keep-old-runs", action="store_true",
                    help="keep finished runs that other code made (masklab's --keep-old-runs: the tables then say they mix code)")
    a = ap.parse_args()
    if unknown := set(a.names) - set(names):
        ap.error(f"unknown: {', '.join(sorted(unknown))} (choose from {', '.join(names)})")
    failed = [n for n, args in REPRODUCTIONS if (not a.names or n in a.names) and run(n, args, a.jobs, a.keep_old_runs) != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
