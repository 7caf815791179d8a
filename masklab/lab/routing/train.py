"""Training a router on a target: causal evidence sets, attention, or gold evidence.

:func:`train_router` takes ``examples`` as either

* a :class:`~masklab.lab.tasks.evidence_gyms.Gym` - **fresh examples every step** (lengths drawn
  from ``[min_items, items]``), with the targets computed on the fly from the teacher
  (:func:`masklab.lab.evidence.targets.target_masks`; leave-one-out runs all ``B x N`` masked
  variants in batched forward passes). A first prototype trained on a fixed set of 8,000
  examples and its routers either stayed near random or overfit; or
* an :class:`~masklab.lab.tasks.evidence_gyms.EvidenceBatch` - a fixed pool, drawn from in
  mini-batches, with ``targets`` a ``(P, N)`` tensor for the pool (or a name, computed once).

Losses: ``bce`` - binary cross-entropy per item against a bool target; ``listwise`` - cross-
entropy between the softmax over items and the target spread evenly over its items (a float
target, e.g. raw attention scores, is normalised to a distribution and always uses this).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from masklab.util import device as devices
from masklab.lab.evidence.attention_targets import top_k
from masklab.lab.evidence.targets import target_masks
from masklab.lab.routing.routers import TokenRouter
from masklab.lab.runner import Checkpoint, MasklabError, warmup_cosine
from masklab.lab.tasks.evidence_gyms import EvidenceBatch, Gym

LOSSES = ("bce", "listwise")


def router_loss(scores: Tensor, target: Tensor, valid: Tensor, loss: str = "bce") -> Tensor:
    """scores ``(B, N)`` (``-inf`` on padding), target ``(B, N)`` bool or float, valid ``(B, N)``."""
    if target.dtype == torch.bool and loss == "bce":
        return F.binary_cross_entropy_with_logits(scores[valid], target[valid].float())
    if loss not in LOSSES:
        raise MasklabError(f"unknown router loss {loss!r}; choose from {', '.join(LOSSES)}")
    t = target.float().masked_fill(~valid, 0.0)
    t = t / t.sum(1, keepdim=True).clamp(min=1e-9)
    logp = torch.log_softmax(scores, dim=1)
    return -torch.where(valid, t * logp, torch.zeros_like(logp)).sum(1).mean()


def train_router(
    router: TokenRouter,
    examples: Gym | EvidenceBatch,
    targets: str | Tensor = "loo",
    teacher=None,
    items: int = 16,
    min_items: int | None = None,
    steps: int = 1500,
    batch: int = 64,
    lr: float = 2e-3,
    loss: str = "bce",
    seed: int = 0,
    ckpt_dir: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Train ``router`` in place; returns ``{"curves": {step, loss, recall}, "seconds": ...}``.

    ``targets``: a target name (``gold``, ``loo``, ``greedy-minimal``, ``last-mean/topk``, ...,
    see :func:`masklab.lab.evidence.targets.target_names`; needs ``teacher`` unless ``gold``) or,
    with a fixed pool, a ``(P, N)`` tensor. ``recall`` in the curves is the fraction of target
    items among the router's top-|target| items on the training batches (a running measure
    of how well the router fits its target). The router trains on the run's device
    (:func:`masklab.util.device.current`); batches and targets are drawn on the CPU, then moved."""
    if isinstance(targets, str) and targets != "gold" and teacher is None:
        raise MasklabError(f"target {targets!r} is computed from a teacher; pass teacher=")
    fixed = isinstance(examples, EvidenceBatch)
    if fixed and isinstance(targets, str):
        targets = target_masks(teacher, examples, targets)
    if fixed and targets.shape != examples.valid.shape:
        raise MasklabError(f"targets {tuple(targets.shape)} do not match the pool {tuple(examples.valid.shape)}")
    lo = min_items if min_items is not None else max(1, items // 2)
    dev = devices.current()
    router.to(dev)  # before the optimiser: its state lives beside the parameters
    opt = torch.optim.AdamW(router.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    ckpt = Checkpoint(ckpt_dir) if ckpt_dir is not None else None
    step, curves = 0, {"step": [], "loss": [], "recall": []}
    if ckpt is not None and ckpt.exists:
        step, extra = ckpt.load(router, opt, gen)
        curves = extra["curves"]
    if teacher is not None:
        teacher.eval()
    start = time.perf_counter()
    log_every = max(1, steps // 20)
    run_loss, run_recall, seen = 0.0, 0.0, 0
    router.train()
    while step < steps:
        rng = np.random.default_rng([seed, 31337, step])  # the data of step s is fixed: resume-safe
        if fixed:
            idx = torch.from_numpy(rng.choice(len(examples), size=min(batch, len(examples)), replace=False))
            b, target = examples.select(idx), targets[idx]
        else:
            b = examples.sample(batch, (lo, items), rng)
            target = target_masks(teacher, b, targets)
        for g in opt.param_groups:
            g["lr"] = warmup_cosine(step, steps, lr, min(100, steps // 10), floor=0.05)
        on = b.to(dev)
        scores = router(on.items, on.query, on.valid, on.positions)
        value = router_loss(scores, target.to(dev), on.valid, loss)
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(router.parameters(), 1.0)
        opt.step()
        step += 1
        run_loss += value.item()
        run_recall += fit_recall(scores.detach().cpu(), target, b.valid)
        seen += 1
        if step % log_every == 0 or step == steps:
            curves["step"].append(step)
            curves["loss"].append(run_loss / seen)
            curves["recall"].append(run_recall / seen)
            if log:
                log(f"router step {step}/{steps} loss {run_loss / seen:.4f} target recall {run_recall / seen:.3f}")
            run_loss, run_recall, seen = 0.0, 0.0, 0
            if ckpt is not None:
                ckpt.save(step, router, opt, gen, {"curves": curves})
    if ckpt is not None:
        ckpt.clear()
    router.eval()
    return {"curves": curves, "seconds": round(time.perf_counter() - start, 2)}


def fit_recall(scores: Tensor, target: Tensor, valid: Tensor) -> float:
    """Mean fraction of a bool target's items among the top-|target| scores (1.0 = perfect ranking);
    for a float target, whether the top-1 item is the target's top-1."""
    if target.dtype != torch.bool:
        s = target.masked_fill(~valid, float("-inf"))
        return float((scores.argmax(1) == s.argmax(1)).float().mean())
    k = target.sum(1)
    sel = top_k(scores, valid, k)
    has = k > 0
    if not bool(has.any()):
        return 1.0
    return float(((sel & target).sum(1)[has].float() / k[has].float()).mean())
