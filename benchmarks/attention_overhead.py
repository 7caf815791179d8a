"""Cost of a learnable mask prior: attention forward+backward per path, and whole training steps.

    python benchmarks/attention_overhead.py [--lengths 16,64,256,1024] [--tokens 8192] [--reps 9]
        [--models gotu,lm,vision,arith] [--compile] [--out benchmarks/attention_overhead.json]

Part 1, attention only: for each length T, batch B = tokens / T, width 64, 4 heads of 16, one
thread, forward+backward of :class:`~masklab.priors.attention.Attention` with the same weights on
every path:

* ``plain``   - no prior (SDPA's flash kernel): the denominator of every ratio;
* ``frozen``  - a frozen :class:`~masklab.priors.bias.MaskPrior` (a float mask without gradient),
  ``impl="auto"``;
* ``math``    - a learnable per-head prior, ``impl="math"`` (SDPA's math kernel, the reference);
* ``blocked`` - the same prior, ``impl="blocked"`` (what ``impl="auto"`` picks on CPU for
  T >= 128);
* ``compile`` - ``torch.compile`` of the eager attention with the learnable prior (with
  ``--compile``).

Part 2, a whole training step (forward, loss, backward, AdamW step) of each study's model at
its default size, random inputs: without prior, with a learnable prior (``auto``: math at
these lengths, all <= 64), with the prior on ``impl="math"`` and on ``impl="blocked"``, and (with
``--compile``) ``torch.compile`` of the model without and with prior.

Variants are interleaved within every repetition so machine noise hits all alike; each figure
is a median over ``--reps`` repetitions after 2 warm-ups. Only ratios are written to the JSON
(to the ``plain`` path, or to the same model without prior), all from this one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from masklab import MaskPrior
from masklab.priors.attention import Attention, set_attention_impl
from masklab.models import GPT, ViT, TokenEncoder


def timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def interleaved(variants: dict[str, Callable[[], None]], reps: int) -> dict[str, float]:
    """Median seconds of each variant, run round-robin: 2 warm-ups then ``reps`` timed rounds."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(reps + 2):
        for name, fn in variants.items():
            dt = timed(fn)
            if rep >= 2:
                times[name].append(dt)
    return {name: statistics.median(t) for name, t in times.items()}


def attention_step(attn: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        y = attn(x)
        y = y[0] if isinstance(y, tuple) else y
        y.square().mean().backward()

    return step


class EagerAttention(nn.Module):
    """The eager attention (logits + prior, softmax, PV) as one function, for ``torch.compile``."""

    def __init__(self, attn: Attention) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, return_attn=True)[0]


def attention_part(lengths: list[int], tokens: int, reps: int, compile_: bool) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    print(f"attention forward+backward, {tokens} tokens/step, width 64, 4 heads; ratio to plain SDPA")
    for T in lengths:
        B = max(1, tokens // T)
        torch.manual_seed(0)
        structure = torch.rand(T, T)
        plain = Attention(64, 4)
        frozen = Attention(64, 4, MaskPrior(structure, mode="frozen", heads=4))
        math_ = Attention(64, 4, MaskPrior(structure, heads=4), impl="math")
        blocked = Attention(64, 4, MaskPrior(structure, heads=4), impl="blocked")
        for a in (frozen, math_, blocked):
            a.load_state_dict(plain.state_dict(), strict=False)
        x = torch.randn(B, T, 64)
        variants = {
            "plain": attention_step(plain, x),
            "frozen": attention_step(frozen, x),
            "math": attention_step(math_, x),
            "blocked": attention_step(blocked, x),
        }
        if compile_:
            variants["compile"] = attention_step(torch.compile(EagerAttention(math_)), x)
        med = interleaved(variants, reps)
        rows[str(T)] = {name: med[name] / med["plain"] for name in med}
        print(f"T={T:>5} B={B:>4}  " + "  ".join(f"{n} {r:.2f}x" for n, r in rows[str(T)].items()), flush=True)
    return rows


def study_models() -> dict[str, Callable[[bool], tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]]]:
    """Each study's model at its default size: ``build(prior) -> (model, loss_fn)``."""

    def gotu(prior: bool):  # TokenEncoder: 15 Boolean variables + CLS, width 64, 2 blocks, 4 heads, batch 128
        priors = [MaskPrior(torch.rand(4, 16, 16)) for _ in range(2)] if prior else None
        model = TokenEncoder(2, 15, 64, 2, 4, priors)
        x, y = torch.randint(2, (128, 15)), torch.randn(128)
        return model, lambda m: F.mse_loss(m(x)[0][:, 0], y)

    def lm(prior: bool):  # GPT: bytes, context 64, dim 64, 3 blocks, 4 heads, batch 32
        priors = [MaskPrior(torch.rand(4, 64, 64)) for _ in range(3)] if prior else None
        model = GPT(256, 64, 64, 3, 4, priors)
        x = torch.randint(256, (32, 65))
        return model, lambda m: F.cross_entropy(m(x[:, :-1])[0].flatten(0, 1), x[:, 1:].flatten())

    def vision(prior: bool):  # ViT cpu-digits: 8x8 images, patch 2 (16 patches + CLS), dim 64, 4 blocks, batch 128
        priors = [MaskPrior(torch.rand(4, 17, 17)) for _ in range(4)] if prior else None
        model = ViT(8, 2, 1, 10, 64, 4, 4, priors)
        x, y = torch.randn(128, 1, 8, 8), torch.randint(10, (128,))
        return model, lambda m: F.cross_entropy(m(x)[0], y)

    def arith(prior: bool):  # GPT: 3-digit sums (11 tokens), dim 64, 2 blocks, 4 heads, shared prior, batch 128
        priors = [MaskPrior(torch.rand(11, 11)) for _ in range(2)] if prior else None
        model = GPT(16, 11, 64, 2, 4, priors)
        x = torch.randint(16, (128, 12))
        return model, lambda m: F.cross_entropy(m(x[:, :-1])[0].flatten(0, 1), x[:, 1:].flatten())

    return {"gotu": gotu, "lm": lm, "vision": vision, "arith": arith}


def train_step(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor]) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model).backward()
        opt.step()

    return step


def step_part(models: list[str], reps: int, compile_: bool) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    print("whole training step (forward, loss, backward, AdamW); ratio to the same model without prior")
    for name, build in study_models().items():
        if name not in models:
            continue
        torch.manual_seed(0)
        base, loss_base = build(False)
        torch.manual_seed(0)
        with_prior, loss_prior = build(True)
        torch.manual_seed(0)
        with_math, loss_math = build(True)
        set_attention_impl(with_math, "math")
        torch.manual_seed(0)
        with_blocked, loss_blocked = build(True)
        set_attention_impl(with_blocked, "blocked")
        variants = {
            "no prior": train_step(base, loss_base),
            "prior": train_step(with_prior, loss_prior),
            "prior, math": train_step(with_math, loss_math),
            "prior, blocked": train_step(with_blocked, loss_blocked),
        }
        if compile_:
            torch.manual_seed(0)
            cb, lb = build(False)
            torch.manual_seed(0)
            cp, lp = build(True)
            variants["compiled, no prior"] = train_step(torch.compile(cb), lb)
            variants["compiled, prior"] = train_step(torch.compile(cp), lp)
        med = interleaved(variants, reps)
        rows[name] = {v: med[v] / med["no prior"] for v in med}
        print(f"{name:>7}  " + "  ".join(f"{v} {r:.2f}x" for v, r in rows[name].items()), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="16,64,256,1024", help="comma-separated; empty: skip part 1")
    ap.add_argument("--models", default="gotu,lm,vision,arith", help="comma-separated; empty: skip part 2")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--step-reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (minutes of compiling per shape)")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(t) for t in args.lengths.split(",") if t]
    result = {
        "command": "python benchmarks/attention_overhead.py "
        + f"--lengths '{args.lengths}' --models '{args.models}' --reps {args.reps} --step-reps {args.step_reps}"
        + (" --compile" if args.compile else ""),
        "threads": args.threads,
        "tokens_per_step": args.tokens,
        "width": 64,
        "heads": 4,
        "reps": args.reps,
        "step_reps": args.step_reps,
        "torch": torch.__version__,
        "attention_ratio_to_plain": attention_part(lengths, args.tokens, args.reps, args.compile),
        "train_step_ratio_to_no_prior": step_part(
            [m for m in args.models.split(",") if m], args.step_reps, args.compile
        ),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
