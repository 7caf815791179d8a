"""Load time of a pretrained model: first load (GGUF de-quantisation + cache build) vs cached load.

    python benchmarks/pretrained_load.py [--model smollm2-135m] [--threads 1]

Builds the cache in a temporary directory (the user's cache is not touched), then loads
from it three times; prints both times and their ratio, measured in one run.
"""

import argparse
import tempfile
import time
from pathlib import Path

from masklab.pretrained.models import load


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        first = load(args.model, threads=args.threads, cache_dir=Path(tmp))
        cold = time.perf_counter() - t
        assert first.source == "gguf"
        warm = []
        for _ in range(3):
            t = time.perf_counter()
            lm = load(args.model, threads=args.threads, cache_dir=Path(tmp))
            warm.append(time.perf_counter() - t)
            assert lm.source == "cache"
    best = min(warm)
    print(
        f"{args.model}: GGUF load + cache build {cold:.1f} s; cached load {best:.2f} s (best of 3); "
        f"speed-up x{cold / best:.0f}"
    )


if __name__ == "__main__":
    main()
