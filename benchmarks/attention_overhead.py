"""Training-step time of attention with a learnable mask prior vs plain SDPA (same shapes).

Ratios are measured in one run, interleaving the variants so machine noise hits both:

    python benchmarks/attention_overhead.py [--lengths 16,64,256,1024] [--tokens 8192] [--reps 15]

Prints one row per sequence length T: batch B = tokens / T, width 64, 4 heads; median
forward+backward time of ``Attention(prior=None)`` and ``Attention(prior=MaskPrior)``, and
their ratio (goal <= 1.10). A third column times a fixed float mask (no gradient), to
separate the cost of a mask in SDPA from the cost of learning it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from masklab import Attention, MaskPrior


def step_time(attn: Attention, x: torch.Tensor, bias: torch.Tensor | None) -> float:
    t = time.perf_counter()
    y, _ = attn(x, bias)
    y.square().mean().backward()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="16,64,256,1024")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"threads={args.threads} tokens/step={args.tokens} width=64 heads=4")
    print(f"{'T':>6} {'B':>5} {'plain ms':>9} {'fixed-mask ms':>14} {'mask-prior ms':>14} {'prior/plain':>12}")
    for T in [int(t) for t in args.lengths.split(",")]:
        B = max(1, args.tokens // T)
        plain = Attention(64, 4)
        prior = Attention(64, 4, MaskPrior(torch.rand(T, T)))
        prior.load_state_dict(plain.state_dict(), strict=False)
        fixed = torch.randn(T, T).clamp(max=0)
        x = torch.randn(B, T, 64)
        times = {"plain": [], "fixed": [], "prior": []}
        for rep in range(args.reps + 2):
            for name, attn, bias in (("plain", plain, None), ("fixed", plain, fixed), ("prior", prior, None)):
                dt = step_time(attn, x, bias)
                if rep >= 2:  # warm-up
                    times[name].append(dt)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{T:>6} {B:>5} {med['plain']:>9.2f} {med['fixed']:>14.2f} {med['prior']:>14.2f} {med['prior'] / med['plain']:>12.2f}")


if __name__ == "__main__":
    main()
