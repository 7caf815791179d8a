"""Wall time of `masklab reproduce gotu` (or `--quick`), measured end to end.

    python benchmarks/gotu_walltime.py [--quick] [--out runs/bench-gotu]

Prints wall seconds, the sum of per-run seconds and the machine load at start and end, so
a number taken on a shared machine is recognisable as such.
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
    ap.add_argument("--out", default="runs/bench-gotu")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)  # a benchmark must not resume
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "masklab", "reproduce", "gotu", "--out", str(out), "--no-progress"] + (
        ["--quick"] if args.quick else []
    )
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    runs = json.loads((out / "results.json").read_text())["runs"]
    print(
        f"reproduce gotu{' --quick' if args.quick else ''}: wall {wall:.0f} s, {len(runs)} runs, "
        f"sum of run times {sum(r['seconds'] for r in runs):.0f} s, "
        f"load {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
