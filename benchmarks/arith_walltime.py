"""Wall time of `masklab reproduce arith` (or `--quick`), measured end to end.

    python benchmarks/arith_walltime.py [--quick] [--jobs 2] [--out runs/bench-arith]

Prints wall seconds, the sum of per-run wall and CPU seconds and the machine load at start
and end, so a number taken on a shared machine is recognisable as such (the CPU seconds /
jobs is what the run would take on an idle machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="runs/bench-arith")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)  # a benchmark must not resume
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "masklab",
        "reproduce",
        "arith",
        "--out",
        str(out),
        "--jobs",
        str(args.jobs),
        "--no-progress",
    ]
    subprocess.run(cmd + (["--quick"] if args.quick else []), check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    runs = json.loads((out / "results.json").read_text())["runs"]
    cpu = sum(r["metrics"]["cpu_seconds"] for r in runs)
    print(
        f"reproduce arith{' --quick' if args.quick else ''}: wall {wall:.0f} s, {len(runs)} runs, "
        f"sum of run times {sum(r['seconds'] for r in runs):.0f} s, "
        f"CPU {cpu:.0f} s (/{args.jobs} jobs = {cpu / args.jobs:.0f} s), "
        f"load {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
