"""Sweep: does vanilla fail at addition 0.4% once the model is bigger, and does the prior's gap appear there?

``masklab sweep arith-size`` trains the arithmetic study's decoder (:mod:`masklab.lab.studies.arith`)
on 3-digit addition from 0.4% of the operand pairs (the paper's headline task) at several
model sizes: width (``dim``) and depth multiplied by the same factor, x1 (dim 64, depth 2:
the study's model), x2 (128, 4) and x4 (256, 8), heads fixed at 4, the study's recipe
otherwise (2500 AdamW steps of batch 128, lr 1e-3). At x1 vanilla already learns the task
(docs/arith.md), while the paper reports 1.19% for vanilla: a model that can memorise the
4000 training pairs might be what fails. Methods: ``vanilla``, ``mask`` and the
``mask-zero`` control (the same learnable prior without structure).

Method labels are ``<method>_x<factor>`` (``mask_x2``), or ``<method>_w<a>d<b>`` when width
and depth are scaled differently. Each run's parameter count is in ``runs[i].extra.parameters``.

Cost (an estimate, not a measurement of the sweep; ``benchmarks/arith_size_cost.py``): one
run is about 2500 x (CPU-s per step) + 23 x (CPU-s to decode 1000 pairs); on one thread of
the shared 2-core machine that is about 73, 335 and 2190 CPU-s at x1, x2 and x4 (a whole x1
run measured 71). 3 sizes x 3 methods x 3 seeds: about 23,400 CPU-s (6.5 CPU-hours, 84% at
x4), about 3.2 hours with ``--jobs 2`` on an idle 2-core CPU. ``--quick`` (x1 and x2, 1 seed,
40 steps) checks that the sweep runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path

from masklab.lab.report import plot_bars, write_markdown
from masklab.util.errors import MasklabError
from masklab.lab.runner import RunSpec, run_study
from masklab.lab.studies import arith

NAME = "arith-size"
TABLE_METRICS = [
    "exact_acc",
    "digit_acc",
    "train_exact_acc",
    "steps_to_90",
    "prior_mass_final",
    "mask_drift",
    "cpu_seconds",
]


@dataclass
class Config(arith.Config):
    ops: list[str] = field(default_factory=lambda: ["add"])
    add_fractions: list[float] = field(default_factory=lambda: [0.004])
    methods: list[str] = field(default_factory=lambda: ["vanilla", "mask", "mask-zero"])
    sizes: list[list[int]] = field(default_factory=lambda: [[1, 1], [2, 2], [4, 4]])  # [width factor, depth factor]


def quick_config() -> Config:
    """x1 and x2 only, 1 seed, 40 steps, 500 held-out pairs: checks that the sweep runs."""
    return Config(sizes=[[1, 1], [2, 2]], seeds=[0], steps=40, evals=2, warmup=0.25, test_size=500)


def reproduce_config() -> Config:
    return Config()


def label(method: str, w: int, d: int) -> str:
    return f"{method}_x{w}" if w == d else f"{method}_w{w}d{d}"


def sized(cfg: Config, w: int, d: int) -> arith.Config:
    """The arith config of one size: ``dim * w``, ``depth * d``."""
    base = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(arith.Config)}
    return arith.Config(**{**base, "dim": cfg.dim * w, "depth": cfg.depth * d})


def specs_for(cfg: Config) -> list[RunSpec]:
    out = []
    for w, d in cfg.sizes:
        for spec in arith.specs_for(sized(cfg, w, d)):
            out.append(RunSpec(spec.task, label(spec.method, w, d), spec.seed, {**spec.params, "size": [w, d]}))
    return out


def validate(cfg: Config) -> None:
    if not cfg.sizes:
        raise MasklabError("arith-size needs at least one size")
    for size in cfg.sizes:
        if len(size) != 2 or min(size) < 1:
            raise MasklabError(f"a size is [width factor, depth factor], both >= 1; got {size}")
        arith.validate(sized(cfg, *size))


NOTES = """\
Each method is an arith method at a model size: `_x2` = width and depth x2 (dim 128, depth 4;
x1 is the arith study's dim 64, depth 2), heads 4 throughout, the same recipe at every size
(no per-size tuning of lr or steps). Task: addition of 3-digit numbers from 0.4% of the
10^6 operand pairs. `train_exact_acc` against `exact_acc` shows memorisation. The paper
reports exact accuracy mask 0.7749, vanilla 0.0119 on this task without a model size we can
match (docs/papers.md). `mask-zero` is the mask's learnable prior with no structure (M = 0)."""


def run(
    cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab sweep arith-size"
) -> dict:
    validate(cfg)
    results = run_study(
        NAME, asdict(cfg), specs_for(cfg), "masklab.lab.studies.arith:run_one", out, jobs=jobs, progress=progress
    )
    out = Path(out)
    figures = ["size_exact_acc.png", "size_train_exact_acc.png"]
    plot_bars(
        results["runs"],
        "exact_acc",
        out / figures[0],
        ylabel="held-out exact accuracy",
        title="Addition 0.4% by model size",
    )
    plot_bars(
        results["runs"],
        "train_exact_acc",
        out / figures[1],
        ylabel="training exact accuracy",
        title="Memorisation by model size",
    )
    params = {
        r["method"].rpartition("_")[2]: r["extra"]["parameters"]
        for r in results["runs"]
        if r["method"].startswith("vanilla")
    }
    notes = NOTES + (
        "\n\nParameters (vanilla): " + ", ".join(f"{k} {v:,}" for k, v in params.items()) if params else ""
    )
    write_markdown(results, out, TABLE_METRICS, command, notes, figures)
    return results
