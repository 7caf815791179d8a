"""Prototype: adapt a frozen pretrained LM by training attention priors alone (issue 13).

Every attention layer gets a :class:`~masklab.bias.RelativePrior` (per head, per relative
distance bucket) through :func:`masklab.hf.attach_priors`; the model itself is frozen. The
priors are trained with teacher forcing on the *current* value of generated stale-fact
prompts (:mod:`masklab.tasks.stale_prompts`) and evaluated by greedy decoding on held-out
prompts whose entities, value types (attributes, hence also the wordings of statements,
updates and questions) and distances (distractor sentences per gap) were never trained on.

Methods: ``base`` (no training) and ``prior`` (priors only). Reported per method:
held-out ``accuracy`` / ``stale_rate`` / ``other_rate``, trainable parameters, perplexity
on a fixed slice of CPython's pydoc text (what the adaptation costs elsewhere) and wall
time. Not wired into the CLI yet: run ``python -m masklab.studies.tune_prior --quick``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

NAME = "tune-prior"
TRAIN_ATTRIBUTES = ("city", "colour", "job")
TEST_ATTRIBUTES = ("pet", "number")


@dataclass
class Config:
    model: str = "smollm2-135m"
    methods: list[str] = field(default_factory=lambda: ["base", "prior"])
    train_prompts: int = 400
    test_prompts: int = 100
    steps: int = 400
    lr: float = 0.05
    train_filler: tuple[int, int] = (0, 2)  # distractor sentences per gap
    test_filler: tuple[int, int] = (3, 4)
    updates: tuple[int, int] = (1, 2)
    max_distance: int = 512
    exact: int = 16
    log_buckets: int = 16
    init: float = 0.0  # theta at start: logsigmoid(0) everywhere = a constant shift, outputs unchanged
    ppl_tokens: int = 512
    max_new_tokens: int = 5
    seed: int = 0
    threads: int = 1


def quick_config() -> Config:
    return Config(train_prompts=60, test_prompts=30, steps=60, ppl_tokens=256)


def split_prompts(n: int, seed: int, train: bool, cfg: Config) -> list:
    """Prompts of the train or the held-out split: disjoint entity names, attributes
    (value types and wordings) and distractor distances."""
    from masklab.tasks.stale_prompts import NAMES, make_prompt

    names = set(NAMES[: len(NAMES) // 2]) if train else set(NAMES[len(NAMES) // 2:])
    attrs = TRAIN_ATTRIBUTES if train else TEST_ATTRIBUTES
    filler = cfg.train_filler if train else cfg.test_filler
    rng = random.Random(seed * 2 + (0 if train else 1))
    out = []
    while len(out) < n:
        p = make_prompt(rng, updates=cfg.updates, filler=filler, attribute=rng.choice(attrs))
        if p.entity in names:  # rejection keeps make_prompt's own sampling of everything else
            out.append(p)
    return out


def answer_batch(lm, p) -> tuple[torch.Tensor, int]:
    """``ids (1, T + A)`` of prompt + " " + current value, and ``T`` (prompt tokens)."""
    prompt = lm.tokenizer(p.prompt, return_tensors="pt").input_ids
    full = lm.tokenizer(p.prompt + " " + p.current, return_tensors="pt").input_ids
    T = prompt.shape[1]
    if not torch.equal(full[:, :T], prompt):  # tokenisation merged across the boundary
        T = next(i for i in range(min(T, full.shape[1])) if full[0, i] != prompt[0, i])
    return full, T


def answer_loss(lm, p) -> torch.Tensor:
    full, T = answer_batch(lm, p)
    logits = lm.model(full).logits[0, T - 1:-1]  # predicts tokens T .. end
    return torch.nn.functional.cross_entropy(logits.float(), full[0, T:])


@torch.no_grad()
def evaluate(lm, prompts: list, max_new_tokens: int) -> dict:
    from masklab.pretrained.lm import generate

    counts = {"current": 0, "stale": 0, "other": 0}
    for p in prompts:
        ids = lm.tokenizer(p.prompt, return_tensors="pt").input_ids[0]
        _, text = generate(lm, ids, max_new_tokens)
        counts[p.classify(text)] += 1
    n = len(prompts)
    return {"accuracy": counts["current"] / n, "stale_rate": counts["stale"] / n, "other_rate": counts["other"] / n}


@torch.no_grad()
def pydoc_perplexity(lm, tokens: int) -> float:
    """Perplexity on the first ``tokens`` tokens of two fixed pydoc topics (plain text, not
    in the prompt format; single sentences of it may also appear as prompt distractors)."""
    from pydoc_data.topics import topics

    text = topics[sorted(topics)[len(topics) // 2]] + " " + topics[sorted(topics)[-1]]
    ids = lm.tokenizer(text, return_tensors="pt").input_ids[:, :tokens]
    logits = lm.model(ids).logits[0, :-1].float()
    return math.exp(torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item())


def run_method(lm, method: str, cfg: Config, train: list, test: list) -> dict:
    from masklab.bias import RelativePrior
    from masklab.hf import attach_priors, detach_priors

    t0 = time.perf_counter()
    n_params = sum(p.numel() for p in lm.model.parameters())
    trainable, losses = 0, []
    if method == "prior":
        lm.model.requires_grad_(False)
        priors = attach_priors(lm.model, lambda i, h: RelativePrior(h, cfg.max_distance, cfg.exact, cfg.log_buckets,
                                                                    allowed=cfg.init))
        params = [p for pr in priors for p in pr.parameters()]
        trainable = sum(p.numel() for p in params)
        opt = torch.optim.Adam(params, lr=cfg.lr)
        rng = random.Random(cfg.seed)
        for step in range(cfg.steps):
            loss = answer_loss(lm, train[rng.randrange(len(train))])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if (step + 1) % 25 == 0:
                print(f"step {step + 1}/{cfg.steps} loss {sum(losses[-25:]) / 25:.3f} "
                      f"{time.perf_counter() - t0:.0f}s", flush=True)
    elif method != "base":
        raise ValueError(f"unknown method {method!r}")
    train_s = time.perf_counter() - t0
    res = {"method": method, **evaluate(lm, test, cfg.max_new_tokens), "ppl": pydoc_perplexity(lm, cfg.ppl_tokens),
           "trainable": trainable, "trainable_frac": trainable / n_params, "train_seconds": train_s,
           "seconds": time.perf_counter() - t0}
    if losses:
        k = max(1, len(losses) // 5)
        res["loss_first"], res["loss_last"] = sum(losses[:k]) / k, sum(losses[-k:]) / k
    if method == "prior":
        detach_priors(lm.model)
    return res


def run(cfg: Config, out: Path | None = None) -> dict:
    from masklab.pretrained.models import load

    lm = load(cfg.model, threads=cfg.threads)
    train = split_prompts(cfg.train_prompts, cfg.seed, True, cfg)
    test = split_prompts(cfg.test_prompts, cfg.seed, False, cfg)
    rows = []
    for m in cfg.methods:
        rows.append(run_method(lm, m, cfg, train, test))
        print(json.dumps(rows[-1]), flush=True)
    base = next((r for r in rows if r["method"] == "base"), None)
    if base:
        for r in rows:
            r["ppl_change"] = r["ppl"] / base["ppl"] - 1
    result = {"study": NAME, "config": asdict(cfg), "rows": rows}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m masklab.studies.tune_prior")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--test-prompts", type=int)
    ap.add_argument("--train-filler", help="min,max distractor sentences per gap in training prompts")
    ap.add_argument("--test-filler", help="min,max distractor sentences per gap in held-out prompts")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    cfg = quick_config() if a.quick else Config()
    cfg.model = a.model
    for k in ("steps", "lr", "test_prompts"):
        if getattr(a, k) is not None:
            setattr(cfg, k, getattr(a, k))
    for k in ("train_filler", "test_filler"):
        if getattr(a, k):
            lo, hi = (int(v) for v in getattr(a, k).split(","))
            setattr(cfg, k, (lo, hi))
    run(cfg, a.out)


if __name__ == "__main__":
    main()
