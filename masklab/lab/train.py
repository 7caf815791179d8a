"""The one training loop of the prior studies (gotu, arith, vision, lm), read top to bottom.

A study's ``run_one`` does four things:

1. builds its model, with the attention priors its method names (:func:`priors_for`);
2. applies the QK init its method names (:func:`init_qk`);
3. calls :func:`train` with its ``loss_of(net, step)`` (draw the batch of ``step``, return the
   scalar loss) and its ``evaluate(step)`` (the curve values at ``step``);
4. turns the returned curves into metrics (:func:`steps_to` for steps-to-threshold).

:func:`train` owns everything else: AdamW with the parameter groups of the one weight-decay
rule (:func:`masklab.models.param_groups`), the linear warm-up / cosine schedule (torch's
``LambdaLR``), resume from a :class:`~masklab.lab.runner.Checkpoint`, the NaN guard, evaluation at
step 0 and every ``steps // evals`` steps (each adds ``step``, ``train_loss``, the study's
values and ``mask_drift`` to the curves), checkpoints after each evaluation, and data
parallelism under ``torchrun`` (:mod:`masklab.lab.distributed`; no-ops otherwise).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from masklab.util import device as devices
from masklab.lab import distributed as dist
from masklab.priors.bias import ALiBi, MaskPrior
from masklab.models.optim import param_groups
from masklab.priors.qk_init import QK_INITS
from masklab.lab.runner import Checkpoint, MasklabError, warmup_cosine

#: method name -> MaskPrior mode (``mask-nopos``: the lm study's prior without position embeddings)
MASK_MODES = {
    "mask": "learnable",
    "mask-frozen": "frozen",
    "mask-hard": "hard",
    "mask-nopos": "learnable",
    "mask-zero": "learnable",
}
#: methods whose MaskPrior has the structure's shape but none of its pattern (``M = 0``
#: everywhere, :meth:`masklab.priors.bias.MaskPrior.uniform`): ``mask-zero`` has the learnable
#: parameters of ``mask`` (same shape, optimiser group, no weight decay) without the prior,
#: so ``mask`` vs ``mask-zero`` measures the structure, not the extra parameters
UNSTRUCTURED = {"mask-zero"}


# ----------------------------------------------------------------------------- methods


def priors_for(
    method: str, structures: list[Tensor], allowed: float = 6.0, suppressed: float = 6.0
) -> list[nn.Module] | None:
    """One attention prior per block for ``method``, or None (no prior).

    structures: one ``(H|1, T, T)`` structure in [0, 1] per block. ``mask``, ``mask-frozen``,
    ``mask-hard``, ``mask-nopos`` -> a :class:`~masklab.priors.bias.MaskPrior` per block (mode from
    :data:`MASK_MODES`, init strengths ``allowed``/``suppressed``); ``mask-zero`` -> a learnable
    ``MaskPrior`` of the structure's shape with ``M = 0`` (no structure; :data:`UNSTRUCTURED`); ``alibi`` -> an
    :class:`~masklab.priors.bias.ALiBi` per block with the structure's head count; any other method
    (``vanilla``, the QK inits) -> None."""
    if method in UNSTRUCTURED:
        return [MaskPrior.uniform(s.shape if s.dim() == 3 else (1, *s.shape), MASK_MODES[method]) for s in structures]
    if method in MASK_MODES:
        return [MaskPrior(s, allowed, suppressed, MASK_MODES[method]) for s in structures]
    if method == "alibi":
        return [ALiBi(s.shape[0]) for s in structures]
    return None


def init_qk(
    method: str,
    model: nn.Module,
    structures: list[Tensor],
    allowed: float,
    suppressed: float,
    sample: Callable[[], Tensor],
) -> None:
    """Apply the QK init named ``method`` (:data:`masklab.priors.qk_init.QK_INITS`: ``vanilla``,
    ``default``, ``qk-svd``, ``qk-opt``, ``mimetic``, ``impulse``) to ``model`` in place; other
    methods (priors) leave the model alone. ``sample()`` returns the init-time model inputs
    ``(B, ...)``; it is called only for a QK-init method, so other methods draw nothing from a
    generator it may use."""
    if method in QK_INITS:
        QK_INITS[method].apply(model, sample(), structures, allowed, suppressed)


# ----------------------------------------------------------------------------- the loop


@dataclass
class Recipe:
    """How to train: ``steps`` AdamW steps at peak learning rate ``lr`` after a linear warm-up
    over the fraction ``warmup`` of the steps (at least one step when ``warmup > 0``), cosine
    decay to ``floor * lr`` at ``steps`` (``floor=1``: constant), ``evals`` evaluations,
    optional gradient-norm clipping ``clip``."""

    steps: int
    lr: float
    weight_decay: float = 0.0
    warmup: float = 0.0

    @property
    def warmup_steps(self) -> int:
        return max(1, int(self.warmup * self.steps)) if self.warmup > 0 else 0

    floor: float = 1.0
    evals: int = 10
    clip: float | None = None


@dataclass
class Trained:
    """What :func:`train` returns: the curves (``step``, ``train_loss``, the study's values,
    ``mask_drift``: one entry per evaluation), the step it resumed from (0: a fresh run) and
    the CPU seconds of training and evaluation over all sessions."""

    curves: dict[str, list]
    resumed_from: int
    cpu_seconds: float


def mask_drift(model: nn.Module) -> float | None:
    """Mean drift of the model's :class:`~masklab.priors.bias.MaskPrior` s (None without one)."""
    drifts = [m.drift() for m in model.modules() if isinstance(m, MaskPrior)]
    return float(np.mean(drifts)) if drifts else None


def train(
    model: nn.Module,
    recipe: Recipe,
    loss_of: Callable[[nn.Module, int], Tensor],
    evaluate: Callable[[int], dict[str, Any]],
    gen: torch.Generator,
    ckpt_dir: Path,
    label: str,
) -> Trained:
    """Train ``model`` in place (resuming from ``ckpt_dir`` when it holds a checkpoint).

    loss_of(net, step): the scalar loss of the batch of 0-based ``step``; ``net`` is ``model``
        (DDP-wrapped under ``torchrun``: draw the global batch from ``gen``, which is
        checkpointed, and keep this rank's slice with :func:`masklab.lab.distributed.shard`).
    evaluate(step): ``{name: value}`` to append to the curves; called in eval mode without
        gradients at step 0 and every ``steps // evals`` steps and at the end.
    label: ``task/method``, named by the NaN guard's error.
    """
    model.to(dist.device())  # the run's device, before the optimiser: its state lives beside the parameters
    scaler = devices.grad_scaler()  # fp16 on CUDA only
    # the lambda returns the learning rate itself, so the optimiser's base lr is 1.0
    # (LambdaLR sets lr = base * lambda(step); this keeps warmup_cosine's floats exact)
    opt = torch.optim.AdamW(param_groups(model, recipe.weight_decay), lr=1.0)
    ckpt = Checkpoint(ckpt_dir)
    step, curves, cpu_before = 0, {}, 0.0
    if ckpt.exists:
        step, extra = ckpt.load(model, opt, gen)
        curves, cpu_before = extra["curves"], extra["cpu_seconds"]
    lr_at = lambda s: warmup_cosine(s, recipe.steps, recipe.lr, recipe.warmup_steps, recipe.floor)  # noqa: E731
    schedule = LambdaLR(opt, lr_at, last_epoch=step - 1)  # sets the lr of ``step``
    cpu0 = time.process_time()

    def record(step: int, train_loss: float | None) -> None:
        model.eval()
        with torch.no_grad(), devices.autocast():
            values = {"step": step, "train_loss": train_loss, **evaluate(step), "mask_drift": mask_drift(model)}
        model.train()
        for k, v in values.items():
            curves.setdefault(k, []).append(v)

    resumed_from = step
    if step == 0:
        record(0, None)
    eval_every = max(1, recipe.steps // recipe.evals)
    net = dist.wrap(model)
    net.train()
    running: list[float] = []
    while step < recipe.steps:
        with devices.autocast():
            loss = loss_of(net, step)
        if not torch.isfinite(loss):
            raise MasklabError(f"loss became {loss.item()} at step {step} ({label}); lower --lr")
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            if recipe.clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
            opt.step()
        else:  # fp16 on CUDA: scale the loss, unscale before clipping, skip steps with inf gradients
            scaler.scale(loss).backward()
            if recipe.clip is not None:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
            scaler.step(opt)
            scaler.update()
        schedule.step()
        running.append(dist.mean_across(loss))
        step += 1
        if step % eval_every == 0 or step == recipe.steps:
            record(step, float(np.mean(running)))
            running = []
            if dist.is_main():
                ckpt.save(
                    step, model, opt, gen, {"curves": curves, "cpu_seconds": cpu_before + time.process_time() - cpu0}
                )
            dist.barrier()
    dist.barrier()
    if dist.is_main():
        ckpt.clear()
    return Trained(curves, resumed_from, cpu_before + time.process_time() - cpu0)


# ----------------------------------------------------------------------------- metrics


def steps_to(
    steps: list[int], values: list[float], target: float, above: bool = True, stay: bool = False
) -> int | None:
    """The first evaluation step whose value reaches ``target`` (``>=`` when ``above``, else
    ``<=``); with ``stay``, the first step from which every later value reaches it. None if
    none does."""
    ok = [(v >= target) if above else (v <= target) for v in values]
    for i, s in enumerate(steps):
        if all(ok[i:]) if stay else ok[i]:
            return s
    return None
