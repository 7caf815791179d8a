"""Study A, arithmetic table: low-data addition and multiplication with digit-alignment mask priors.

A GPT-style decoder (:class:`~masklab.models.GPT`) learns fixed-width ``a + b`` or ``a * b``
(``width`` digits each, 3 by default: 10^6 operand pairs) from a small seeded fraction of
the pairs, by teacher forcing on the result digits; it is scored by greedy decoding on a
disjoint held-out set. Methods:

* ``vanilla`` - default init, causal attention only;
* ``qk-svd``, ``qk-opt`` - the digit-alignment pattern put into W_Q, W_K at init
  (:mod:`masklab.priors.qk_init`); their step-0 match to the pattern is measured and reported;
* ``mask`` - a learnable :class:`~masklab.priors.bias.MaskPrior` per block from the digit-alignment
  structure (:func:`masklab.priors.structures.arith_structure`), on top of the causal mask;
  ``mask-frozen`` / ``mask-hard`` are the ablations; ``mask-zero`` the control with the same
  learnable prior but no structure (``M = 0`` everywhere, :meth:`~masklab.priors.bias.MaskPrior.uniform`).

Metrics per run: ``exact_acc`` (whole result right) and ``digit_acc`` (mean over result
digits) on the test set, ``train_exact_acc`` on (up to 2000) training pairs, the attention
mass that the result-emitting queries put on the prior's allowed keys at step 0 and at the
end (every method, mean over heads and layers), the mask's drift, and CPU seconds.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from masklab.lab import distributed as dist  # noqa: E402
from masklab.util.flags import flag, str_list, strength_flag  # noqa: E402
from masklab.models import GPT  # noqa: E402
from masklab.lab.report import plot_curves, save_figure, write_markdown  # noqa: E402
from masklab.util.errors import MasklabError, check_choices  # noqa: E402
from masklab.lab.runner import RunSpec, run_study, seed_everything  # noqa: E402
from masklab.priors.structures import ARITH_PRIORS, allowed_mass, arith_structure, emitting_position, result_width  # noqa: E402
from masklab.lab.tasks.arithmetic import (
    OPS,
    VOCAB,
    WIDTHS,
    greedy_results,
    inputs_targets,
    make_split,
    score,
    train_count,
)  # noqa: E402
from masklab.lab.train import Recipe, init_qk, priors_for, steps_to, train  # noqa: E402

NAME = "arith"
DEVICES = ("cpu", "cuda")  # run_one moves its model and data to the run's device (masklab.util.device)
PRECISIONS = (
    "fp32",
    "bf16",
    "fp16",
)  # its training and evaluation run under masklab.util.device.autocast (masklab/lab/train.py)
METHODS = ("vanilla", "qk-svd", "qk-opt", "mask", "mask-frozen", "mask-hard", "mask-zero")
TABLE_METRICS = [
    "exact_acc",
    "digit_acc",
    "train_exact_acc",
    "steps_to_90",
    "prior_mass_step0",
    "prior_mass_final",
    "mask_drift",
]
TRAIN_PROBE = 2000  # training pairs scored for train_exact_acc
CURVE_PROBE = 1000  # test pairs scored at each evaluation during training
ATTN_PROBE = 256  # test pairs for the attention statistics


def task_name(op: str, fraction: float) -> str:
    """``("add", 0.004) -> "add-0.4%"``."""
    return f"{op}-{fraction * 100:g}%"


# The authors' numbers (docs/papers.md): exact sequence accuracy, 3-digit operands.
PAPER = [
    {"task": "add-0.4%", "method": "mask", "metric": "exact_acc", "value": 0.7749},
    {"task": "add-0.4%", "method": "vanilla", "metric": "exact_acc", "value": 0.0119},
    {"task": "mul-3%", "method": "mask", "metric": "exact_acc", "value": 0.6949},
    {"task": "mul-3%", "method": "vanilla", "metric": "exact_acc", "value": 0.0501},
]


def parse_fractions(items: list[str], ops: list[str]) -> dict[str, list[float]]:
    """``["0.004"]`` -> that fraction for every op in ``ops``; ``["add:0.004", "mul:0.03"]`` ->
    per op (an op named nowhere keeps its default). Returns ``{"add_fractions": ..., ...}``."""
    per: dict[str, list[float]] = {}
    for item in items:
        op, _, value = item.rpartition(":")
        try:
            f = float(value)
        except ValueError:
            raise MasklabError(
                f"--fraction takes numbers or op:number items (e.g. 0.004 or add:0.004,mul:0.03), got {item!r}"
            ) from None
        for o in [op] if op else ops:
            if o not in OPS:
                raise MasklabError(f"unknown operation {o!r} in --fraction; choose from {', '.join(OPS)}")
            per.setdefault(o, []).append(f)
    return {f"{o}_fractions": v for o, v in per.items()}


def fraction_updates(items: list[str], base: "Config", updates: dict) -> dict:
    """``--fraction``: the per-op fraction lists; ``add:0.004`` alone (no ``--op``) also
    means addition only."""
    up = parse_fractions(items, updates.get("ops", base.ops))
    if "ops" not in updates and all(":" in i for i in items):
        up["ops"] = [o for o in OPS if f"{o}_fractions" in up]
    return up


@dataclass
class Config:
    """Everything an arithmetic run depends on. Model: ``depth`` pre-LN blocks of width
    ``dim`` with ``heads`` heads (about 0.1 M parameters at the defaults)."""

    ops: list[str] = flag(
        factory=lambda: ["add", "mul"], name="--op", help=f"comma-separated operations ({', '.join(OPS)})"
    )
    add_fractions: list[float] = flag(
        factory=lambda: [0.002, 0.004, 0.01, 0.03],
        name="--fraction",
        parse=str_list,
        apply=fraction_updates,
        metavar="[OP:]F,...",
        default_text="the paper's sweep: add 0.002,0.004,0.01,0.03, mul 0.01,0.03,0.1",
        help="comma-separated training fractions of all operand pairs: 0.004 (every --op) or add:0.004,mul:0.03",
    )
    mul_fractions: list[float] = field(default_factory=lambda: [0.01, 0.03, 0.1])
    methods: list[str] = flag(
        factory=lambda: ["vanilla", "qk-svd", "qk-opt", "mask"],
        name="--method",
        help=f"comma-separated methods ({', '.join(METHODS)})",
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    width: int = flag(3, help="operand digits, 2..5")
    reverse: bool = flag(False, help="write the result least significant digit first")
    prior: str = flag("shared", choices=ARITH_PRIORS, help="one alignment pattern shared by all heads, or one per head")
    mul_window: int | None = flag(
        None, help="multiplication prior: only partial products with k-W <= i+j <= k", default_text="all i+j <= k"
    )
    allowed: float = strength_flag(6.0)
    suppressed: float = 6.0
    dim: int = flag(64, help="model width")
    depth: int = flag(2, help="transformer blocks")
    heads: int = flag(4, help="attention heads")
    steps: int = flag(2500, help="training steps")
    batch: int = flag(128, help="batch size")
    lr: float = flag(1e-3, help="peak learning rate (AdamW, warm-up then cosine)")
    warmup: float = flag(0.04, help="learning-rate warm-up, as a fraction of --steps")
    weight_decay: float = flag(
        0.1, help="AdamW weight decay on linear weights and token embeddings (never positions, biases, norms or priors)"
    )
    test_size: int = flag(10_000, help="held-out pairs")
    evals: int = flag(10, help="evaluations during training")


def quick_config() -> Config:
    """One task (addition, 1%), one seed, the four methods, 400 steps (about a minute of CPU)."""
    return Config(ops=["add"], add_fractions=[0.01], mul_fractions=[0.03], seeds=[0], steps=400, evals=4, warmup=0.25)


# reproduce: 7 tasks (add at 4 fractions, mul at 3) x 4 methods x 3 seeds = 84 runs of 2500 steps
# (batch 128, dim 64, depth 2): 57-73 CPU-s per run (measured, mean 66), so 84 x 66 / 2 = about 46 min
# with 2 jobs on an idle 2-core CPU. Quick: 4 runs of 400 steps, about 60 CPU-s in all.


def reproduce_config() -> Config:
    return Config()


# ----------------------------------------------------------------------------- one run


def structures_for(p: dict) -> list[torch.Tensor]:
    """The digit-alignment structure of every block, ``(H|1, T, T)`` each, or the caller's
    ``p["structures"]`` (one nested list per block; evidence-prior's derived structures)."""
    if p.get("structures") is not None:
        return [torch.tensor(s, dtype=torch.float32) for s in p["structures"]]
    s = arith_structure(p["op"], p["width"], p["reverse"], p["prior"], p["heads"], p["mul_window"])
    return [s] * p["depth"]


def emitting_rows(p: dict) -> list[int]:
    """Positions of the queries that emit result digits (sorted)."""
    return sorted(
        emitting_position(p["width"], p["op"], k, p["reverse"]) for k in range(result_width(p["width"], p["op"]))
    )


@torch.no_grad()
def attention_mass(model: GPT, probe: torch.Tensor, structures: list[torch.Tensor], rows: list[int]) -> float:
    """Mass of the result-emitting queries on the prior's allowed keys, mean over heads,
    layers and the probe ``(B, T)``."""
    _, attn = model(probe, return_attn=True)
    return float(np.mean([allowed_mass(a[:, :, rows], s[:, rows], "all") for a, s in zip(attn, structures)]))


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    """Train one decoder on the training pairs and score it on the held-out pairs."""
    cpu0 = time.process_time()
    p = spec["params"]
    method, width = p["method"], p["width"]
    gen = seed_everything(spec["seed"])
    split = make_split(p["op"], width, p["fraction"], p["test_size"], spec["seed"], p["reverse"])
    x_train, y_train = inputs_targets(split.sequences("train"), width)
    test_seq = split.sequences("test")
    train_seq = split.sequences("train")[:TRAIN_PROBE]
    structures = structures_for(p)
    rows = emitting_rows(p)
    model = GPT(
        VOCAB,
        x_train.shape[1],
        p["dim"],
        p["depth"],
        p["heads"],
        priors_for(method, structures, p["allowed"], p["suppressed"]),
    )
    probe = inputs_targets(test_seq[:ATTN_PROBE], width)[0]
    curve_seq = test_seq[:CURVE_PROBE]
    sample = lambda: x_train[torch.randperm(len(x_train), generator=gen)[:256]]  # noqa: E731
    init_qk(method, model, structures, p["allowed"], p["suppressed"], sample)  # on the CPU, as every QK init
    # the run's device (a no-op on the CPU): batches are drawn on the CPU by ``gen``, then indexed on it
    model.to(dist.device())
    x_dev, y_dev, probe = (t.to(dist.device()) for t in (x_train, y_train, probe))

    def loss_of(net: torch.nn.Module, step: int) -> torch.Tensor:
        idx = torch.randint(len(x_train), (p["batch"],), generator=gen)
        logits, _ = net(x_dev[idx])
        return F.cross_entropy(logits.flatten(0, 1), y_dev[idx].flatten())

    def evaluate(step: int) -> dict:
        acc = score(greedy_results(model, curve_seq, width), curve_seq, width)["exact_acc"]
        return {"test_exact_acc": float(acc), "prior_mass": attention_mass(model, probe, structures, rows)}

    recipe = Recipe(
        p["steps"], p["lr"], p["weight_decay"], p["warmup"], floor=0.1, evals=p["evals"]
    )  # cosine to 10% of lr
    cpu_setup = time.process_time() - cpu0
    trained = train(model, recipe, loss_of, evaluate, gen, ckpt_dir, f"{spec['task']}/{method}")
    curves, cpu1 = trained.curves, time.process_time()

    model.eval()
    test = score(greedy_results(model, test_seq, width), test_seq, width)
    train_scores = score(greedy_results(model, train_seq, width), train_seq, width)
    metrics = {
        "exact_acc": test["exact_acc"],
        "digit_acc": test["digit_acc"],
        "train_exact_acc": train_scores["exact_acc"],
        "train_digit_acc": train_scores["digit_acc"],
        "final_train_loss": curves["train_loss"][-1],
        "steps_to_90": steps_to(curves["step"], curves["test_exact_acc"], 0.9, stay=True),
        "prior_mass_step0": curves["prior_mass"][0],
        "prior_mass_final": curves["prior_mass"][-1],
        "mask_drift": curves["mask_drift"][-1],
        "cpu_seconds": cpu_setup + trained.cpu_seconds + time.process_time() - cpu1,
    }
    extra = {
        "n_train": len(split.train),
        "n_test": len(split.test),
        "parameters": sum(q.numel() for q in model.parameters()),
        "digit_acc_by_position": test["digit_acc_by_position"],
    }
    return {"metrics": metrics, "curves": curves, "extra": extra}


# ----------------------------------------------------------------------------- study


def tasks_of(cfg: Config) -> list[tuple[str, float]]:
    """(op, fraction) pairs of the study, in order."""
    out = []
    for op in cfg.ops:
        for f in cfg.add_fractions if op == "add" else cfg.mul_fractions:
            out.append((op, f))
    return out


def specs_for(cfg: Config) -> list[RunSpec]:
    base = {
        k: v for k, v in asdict(cfg).items() if k not in ("ops", "add_fractions", "mul_fractions", "methods", "seeds")
    }
    return [
        RunSpec(task_name(op, f), method, seed, {**base, "op": op, "fraction": f, "method": method})
        for op, f in tasks_of(cfg)
        for method in cfg.methods
        for seed in cfg.seeds
    ]


def validate(cfg: Config) -> None:
    check_choices("operation", cfg.ops, OPS)
    check_choices("method", cfg.methods, METHODS)
    check_choices("prior variant", [cfg.prior], ARITH_PRIORS)
    if cfg.width not in WIDTHS:
        raise MasklabError(f"--width must be between {WIDTHS[0]} and {WIDTHS[-1]}, got {cfg.width}")
    if cfg.steps < 1 or cfg.batch < 1 or cfg.lr <= 0 or cfg.evals < 1:
        raise MasklabError("--steps, --batch and --evals must be positive and --lr > 0")
    if cfg.mul_window is not None and cfg.mul_window < 0:
        raise MasklabError("--mul-window must be >= 0")
    if cfg.dim % cfg.heads:
        raise MasklabError(f"--dim {cfg.dim} must be divisible by --heads {cfg.heads}")
    for op, f in tasks_of(cfg):
        if not 0 < f < 1:
            raise MasklabError(f"training fraction must lie in (0, 1), got {f}")
        if train_count(f, cfg.width) + cfg.test_size > 10 ** (2 * cfg.width):
            raise MasklabError(
                f"{task_name(op, f)}: training + {cfg.test_size} test pairs exceed the 10^{2 * cfg.width} pairs; "
                "lower --test-size"
            )


NOTES = """\
Columns: `exact_acc` fraction of held-out pairs whose whole result is decoded right (greedy),
`digit_acc` fraction of result digits right, `train_exact_acc` exact accuracy on up to 2000
training pairs (memorisation), `steps_to_90` the evaluation step from which the exact accuracy on
1000 held-out pairs stays >= 0.9 (mean over the seeds that got there; learning speed), \
`prior_mass_step0/final` attention mass that the result-emitting
queries put on the digit-alignment prior's allowed keys (mean over heads, layers and 256 test
pairs; measured for every method, so for `qk-svd`/`qk-opt` step 0 shows how well the QK init
reproduces the pattern), `mask_drift` mean |change| of logsigmoid(M).
Tasks are named `op-fraction` (e.g. `add-0.4%`: 0.4% of the 10^6 operand pairs for training)."""


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab arith") -> dict:
    validate(cfg)
    paper = PAPER if cfg.width == 3 else []
    results = run_study(
        NAME,
        asdict(cfg),
        specs_for(cfg),
        "masklab.lab.studies.arith:run_one",
        out,
        jobs=jobs,
        paper=paper,
        progress=progress,
    )
    report(results, Path(out), command)
    return results


def plot_fractions(results: dict, path: Path, metric: str = "exact_acc") -> None:
    """Accuracy vs training fraction: one panel per operation, one line per method (mean over
    seeds, min-max band)."""
    runs = results["runs"]
    ops = list(dict.fromkeys(r["spec"]["params"]["op"] for r in runs))
    fig, axes = plt.subplots(1, len(ops), figsize=(4.6 * len(ops), 3.6), squeeze=False)
    for ax, op in zip(axes[0], ops):
        mine = [r for r in runs if r["spec"]["params"]["op"] == op]
        for method in dict.fromkeys(r["method"] for r in mine):
            fr = sorted({r["spec"]["params"]["fraction"] for r in mine if r["method"] == method})
            vals = [
                [r["metrics"][metric] for r in mine if r["method"] == method and r["spec"]["params"]["fraction"] == f]
                for f in fr
            ]
            xs = np.asarray(fr) * 100
            line = ax.plot(xs, [np.mean(v) for v in vals], marker="o", label=method)[0]
            ax.fill_between(xs, [min(v) for v in vals], [max(v) for v in vals], color=line.get_color(), alpha=0.15)
        ax.set_xscale("log")
        ticks = sorted({r["spec"]["params"]["fraction"] * 100 for r in mine})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_title(f"{op} ({results['config']['width']}-digit)")
        ax.set_xlabel("training fraction (%)")
        ax.set_ylabel(metric)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    save_figure(fig, path)


def report(results: dict, out: Path, command: str) -> None:
    figures = ["arith_acc_vs_fraction.png", "arith_test_acc.png", "arith_persistence.png"]
    plot_fractions(results, out / figures[0])
    plot_curves(
        results["runs"],
        "test_exact_acc",
        out / figures[1],
        ylabel="test exact accuracy (1000 pairs)",
        title="Held-out exact accuracy during training",
    )
    plot_curves(
        results["runs"],
        "prior_mass",
        out / figures[2],
        ylabel="mass on allowed keys",
        title="Digit-alignment pattern in attention",
    )
    cfg = results["config"]
    runs = results["runs"]
    n_params = runs[0]["extra"]["parameters"] if runs else None
    notes = NOTES + (
        f"\n\nModel: GPT decoder, dim {cfg['dim']}, depth {cfg['depth']}, heads {cfg['heads']} "
        f"({n_params} parameters); "
        f"{cfg['steps']} AdamW steps of batch {cfg['batch']}, lr {cfg['lr']} "
        f"(warm-up {cfg['warmup']:.0%} of the steps, cosine to 10%), "
        f"weight decay {cfg['weight_decay']}; "
        f"result {'reversed (LSB first)' if cfg['reverse'] else 'plain (MSB first)'}; "
        f"prior `{cfg['prior']}`, strengths +{cfg['allowed']}/-{cfg['suppressed']}; test set {cfg['test_size']} pairs; "
        f"CPU seconds over all runs {sum(r['metrics'].get('cpu_seconds', 0) for r in runs):.0f}."
    )
    write_markdown(results, out, TABLE_METRICS, command, notes, figures)
