"""Study A, vision table: a 2-D locality mask prior vs default / mimetic / impulse inits in a ViT.

A :class:`~masklab.models.ViT` is trained from scratch for image classification (AdamW,
linear warm-up then cosine decay, random-crop/flip augmentation). Methods:

* ``default`` - the ViT's own init;
* ``mimetic`` - W_Q W_K^T ~ alpha I, W_V W_O ~ -beta I plus noise (Trockman & Kolter 2023);
* ``impulse`` - each head's attention at init is a 3x3 convolution impulse over the patch
  grid, built from the position embeddings and W_Q, W_K (:class:`masklab.priors.qk_init.Impulse`);
* ``mask`` - a learnable 2-D locality :class:`~masklab.priors.bias.MaskPrior` in every block (head 0
  a 3x3 neighbourhood, the other heads one relative offset each; CLS unconstrained);
* ``mask-zero`` - the same learnable ``(H, T, T)`` MaskPrior with no structure (``M = 0``
  everywhere, a uniform bias: :meth:`masklab.priors.bias.MaskPrior.uniform`): the control that
  separates the locality structure from the extra learnable parameters.

Per run: top-1 test accuracy, losses, and the attention's locality over training (mass of
patch queries on their 3x3 neighbourhood and on the impulse targets) plus the mask drift;
the layer-0 attention of the centre patch at step 0 is kept for the figure.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from masklab.lab import distributed as dist  # noqa: E402
from masklab.util.flags import flag, strength_flag  # noqa: E402
from masklab.models import PRESETS, ViT  # noqa: E402
from masklab.lab.report import fmt, plot_curves, save_figure, stat_cell, write_markdown  # noqa: E402
from masklab.util.errors import MasklabError, check_choices  # noqa: E402
from masklab.lab.runner import RunSpec, run_study, seed_everything  # noqa: E402
from masklab.priors.structures import allowed_mass, impulse_2d, locality_2d, neighbourhood_2d  # noqa: E402
from masklab.lab.tasks.vision import DATASETS, VisionData, augment, load_vision, normalise  # noqa: E402
from masklab.lab.train import Recipe, init_qk, priors_for, train  # noqa: E402

NAME = "vision"
DEVICES = ("cpu", "cuda")  # run_one moves its model and data to the run's device (masklab.util.device)
PRECISIONS = (
    "fp32",
    "bf16",
    "fp16",
)  # its training and evaluation run under masklab.util.device.autocast (masklab/lab/train.py)
METHODS = ("default", "mimetic", "impulse", "mask", "mask-zero")
DEFAULT_METHODS = ("default", "mimetic", "impulse", "mask")
TABLE_METRICS = [
    "test_acc",
    "test_loss",
    "train_loss",
    "local_mass_step0",
    "local_mass_final",
    "impulse_mass_step0",
    "mask_drift",
]

# The authors' ViT-Tiny numbers (docs/papers.md), top-1 % on CIFAR-10.
PAPER = [
    {"task": "cifar10", "method": "mask", "metric": "test_acc", "value": 95.66},
    {"task": "cifar10", "method": "default", "metric": "test_acc", "value": 94.20},
    {"task": "cifar10", "method": "impulse", "metric": "test_acc", "value": 95.12},
]


@dataclass
class Config:
    """Everything a vision run depends on. ``patch``/``dim``/``depth``/``heads`` override
    the ``model`` preset when set."""

    data: str = flag("digits", choices=DATASETS, help="data set (digits is embedded)")
    data_dir: str | None = flag(None, help="local folder of cifar10/cifar100 (binary version) or imagefolder data")
    image_size: int = flag(64, help="imagefolder only: resize images to this side")
    model: str = flag("cpu-digits", help=f"ViT preset ({', '.join(PRESETS)})")
    patch: int | None = flag(None, help="patch side", default_text="the preset's")
    dim: int | None = flag(None, help="model width", default_text="the preset's")
    depth: int | None = flag(None, help="transformer blocks", default_text="the preset's")
    heads: int | None = flag(None, help="attention heads", default_text="the preset's")
    methods: list[str] = flag(
        factory=lambda: list(DEFAULT_METHODS), name="--method", help=f"comma-separated methods ({', '.join(METHODS)})"
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = flag(1000, help="training steps")
    batch: int = flag(128, help="batch size")
    lr: float = flag(1e-3, help="peak learning rate (AdamW, warm-up then cosine)")
    weight_decay: float = flag(
        0.05,
        help="AdamW weight decay on linear weights and token embeddings (never positions, biases, norms or priors)",
    )
    warmup: float = flag(0.05, help="learning-rate warm-up, as a fraction of --steps")
    allowed: float = strength_flag(6.0)
    suppressed: float = 6.0
    radius: int = 1
    evals: int = flag(10, help="evaluations during training")


def quick_config() -> Config:
    return Config(model="cpu-micro", seeds=[0], steps=200, evals=4)


# reproduce: digits, cpu-digits (dim 64, depth 4, 4 heads, 16 patches), 5 methods (the defaults
# and the mask-zero control) x 3 seeds x 1000 steps of batch 128; about 2 min per run on one
# thread (an estimate: about 19 min with 2 jobs on 2 cores, scaled from the 15 min of 12 runs).
# Quick keeps the default four methods (add --method ...,mask-zero).


def reproduce_config() -> Config:
    return Config(methods=list(METHODS))


# ----------------------------------------------------------------------------- one run


@functools.lru_cache(maxsize=2)
def _data(name: str, data_dir: str | None, image_size: int) -> VisionData:
    return load_vision(name, data_dir, image_size)


def model_size(p: dict) -> dict:
    if p["model"] not in PRESETS:
        raise MasklabError(f"unknown model preset {p['model']!r}; choose from {', '.join(PRESETS)}")
    size = dict(PRESETS[p["model"]])
    size.update({k: p[k] for k in ("patch", "dim", "depth", "heads") if p.get(k) is not None})
    return size


@torch.no_grad()
def evaluate(model: ViT, x: torch.Tensor, y: torch.Tensor, chunk: int = 500) -> tuple[float, float]:
    """(top-1 accuracy in %, mean cross-entropy) of normalised images ``x`` ``(N, C, S, S)``."""
    correct, loss = 0, 0.0
    for i in range(0, len(x), chunk):
        logits, _ = model(x[i : i + chunk])
        correct += int((logits.argmax(-1) == y[i : i + chunk]).sum())
        loss += float(F.cross_entropy(logits, y[i : i + chunk], reduction="sum"))
    return 100.0 * correct / len(x), loss / len(x)


@torch.no_grad()
def locality(model: ViT, probe: torch.Tensor, local: torch.Tensor, impulse: torch.Tensor) -> tuple[float, float, list]:
    """(patch queries' mass on their 3x3 neighbourhood, on the impulse targets, layer-0
    attention of the centre patch ``(H, grid, grid)`` as lists), means over layers/heads."""
    _, attn = model(probe, return_attn=True)
    loc = float(np.mean([allowed_mass(a[:, :, 1:], local[:, 1:], "all") for a in attn]))
    imp = float(np.mean([allowed_mass(a[:, :, 1:], impulse[:, 1:], "all") for a in attn]))
    g = model.grid
    centre = 1 + (g // 2) * g + g // 2
    maps = attn[0][:, :, centre, 1:].mean(0).reshape(-1, g, g)  # (H, g, g)
    return loc, imp, maps.tolist()


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    """Train one ViT and evaluate it; see the module docstring."""
    p = spec["params"]
    method = p["method"]
    if method not in METHODS:
        raise MasklabError(f"unknown vision method {method!r}; choose from {', '.join(METHODS)}")
    data = _data(p["data"], p["data_dir"], p["image_size"])
    size = model_size(p)
    gen = seed_everything(spec["seed"])
    mean, std = data.stats()
    test_x = normalise(data.test_x, data, mean, std)
    grid = data.image_size // size["patch"]
    if data.image_size % size["patch"]:
        raise MasklabError(f"image size {data.image_size} is not divisible by patch size {size['patch']}")
    if p.get("structures") is not None:  # a caller's structures, one (H|1, T, T) nested list per block (evidence-prior)
        structures = [torch.tensor(s, dtype=torch.float32) for s in p["structures"]]
    else:
        structures = [locality_2d(grid, size["heads"], p["radius"])] * size["depth"]
    priors = priors_for(method, structures, p["allowed"], p["suppressed"])
    model = ViT(
        data.image_size, size["patch"], data.channels, data.classes, size["dim"], size["depth"], size["heads"], priors
    )
    impulse = impulse_2d(grid, size["heads"])
    local = torch.ones(1, grid * grid + 1, grid * grid + 1)
    local[0, 1:, 1:] = neighbourhood_2d(grid, 1)
    local[0, 1:, 0] = 0.0
    sample = normalise(data.train_x[torch.randperm(len(data.train_x), generator=gen)[:256]], data, mean, std)
    probe = sample[:64]
    init_qk(method, model, [impulse] * size["depth"], p["allowed"], p["suppressed"], lambda: sample)
    device = dist.device()  # the run's device (--device; cuda:LOCAL_RANK under torchrun on GPUs)
    model.to(device)
    test_x, test_y, probe = test_x.to(device), data.test_y.to(device), probe.to(device)
    local, impulse = local.to(device), impulse.to(device)

    def loss_of(net: torch.nn.Module, step: int) -> torch.Tensor:
        idx = torch.randint(len(data.train_x), (p["batch"],), generator=gen)  # the global batch, same on every rank
        xb = normalise(augment(data.train_x[idx].float(), data.pad, data.flip, gen), data, mean, std)
        xb, yb = dist.shard(xb.to(device), data.train_y[idx].to(device))
        return F.cross_entropy(net(xb)[0], yb)

    def record(step: int) -> dict:
        acc, loss = evaluate(model, test_x, test_y)
        loc, imp, maps = locality(model, probe, local, impulse)
        return {
            "test_acc": acc,
            "test_loss": loss,
            "local_mass": loc,
            "impulse_mass": imp,
            **({"attn0": maps} if step == 0 else {}),
        }

    recipe = Recipe(p["steps"], p["lr"], p["weight_decay"], p["warmup"], floor=0.0, evals=p["evals"])
    trained = train(model, recipe, loss_of, record, gen, ckpt_dir, f"{spec['task']}/{method}")
    curves = trained.curves
    curves["attn0"] = curves["attn0"][0]  # recorded once, at step 0
    metrics = {
        "test_acc": curves["test_acc"][-1],
        "test_loss": curves["test_loss"][-1],
        "train_loss": curves["train_loss"][-1],
        "local_mass_step0": curves["local_mass"][0],
        "local_mass_final": curves["local_mass"][-1],
        "impulse_mass_step0": curves["impulse_mass"][0],
        "impulse_mass_final": curves["impulse_mass"][-1],
        "mask_drift": curves["mask_drift"][-1],
    }
    return {
        "metrics": metrics,
        "curves": curves,
        "extra": {"size": size, "grid": grid, "world_size": dist.world_size(), "resumed_from": trained.resumed_from},
    }


# ----------------------------------------------------------------------------- study


def specs_for(cfg: Config) -> list[RunSpec]:
    base = {k: v for k, v in asdict(cfg).items() if k not in ("methods", "seeds")}
    return [RunSpec(cfg.data, m, s, {**base, "method": m}) for m in cfg.methods for s in cfg.seeds]


def validate(cfg: Config) -> None:
    check_choices("data set", [cfg.data], DATASETS)
    check_choices("method", cfg.methods, METHODS)
    model_size(asdict(cfg))
    if cfg.steps < 1 or cfg.batch < 1 or cfg.lr <= 0:
        raise MasklabError("--steps and --batch must be positive and --lr > 0")
    if cfg.data != "digits":
        _data(cfg.data, cfg.data_dir, cfg.image_size)  # fail early on bad data (cached for --jobs 1)


NOTES = """\
Columns: `test_acc` top-1 accuracy (%) on the held-out split at the end of training,
`test_loss`/`train_loss` cross-entropy (train: mean over the last evaluation interval, on
augmented batches), `local_mass_*` attention mass of patch queries on the patches of their 3x3
neighbourhood (mean over heads and layers) at step 0 and at the end, `impulse_mass_step0` mass
on each head's impulse target (the pattern the `impulse` init builds), `mask_drift` mean
|change| of logsigmoid(M) (mask and mask-zero runs; mask-zero starts from a uniform M = 0, no
structure, so it measures what the prior's parameters alone do)."""


def paper_table(results: dict) -> str:
    """Ours (this run's data set) beside the paper's CIFAR-10 ViT-Tiny numbers."""
    rows = [
        "| method | ours: test_acc % (" + results["config"]["data"] + ") | paper: CIFAR-10 top-1 % (ViT-Tiny) |",
        "|---|---|---|",
    ]
    for row in results["summary"]:
        paper = [q["value"] for q in results["paper"] if q["method"] == row["method"]]
        ours = f"{stat_cell(row, 'test_acc', 2)} (n={row['n']})"
        rows.append(f"| {row['method']} | {ours} | {fmt(paper[0], 2) if paper else '-'} |")
    return "\n".join(rows)


def plot_attention(results: dict, path: Path) -> None:
    """One row per method, one column per head: layer-0 attention of the centre patch over
    the patch grid at step 0 (first seed)."""
    first: dict[str, dict] = {}
    for r in results["runs"]:
        first.setdefault(r["method"], r)
    methods = list(first)
    heads = len(first[methods[0]]["curves"]["attn0"])
    fig, axes = plt.subplots(len(methods), heads, figsize=(1.9 * heads, 1.9 * len(methods)), squeeze=False)
    for i, m in enumerate(methods):
        for h in range(heads):
            ax = axes[i][h]
            ax.imshow(np.asarray(first[m]["curves"]["attn0"][h]), cmap="viridis", vmin=0)
            ax.set_xticks([])
            ax.set_yticks([])
            if h == 0:
                ax.set_ylabel(m)
            if i == 0:
                ax.set_title(f"head {h}", fontsize=9)
    fig.suptitle("Step 0: layer-0 attention of the centre patch over the patch grid")
    save_figure(fig, path)


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab vision") -> dict:
    validate(cfg)
    results = run_study(
        NAME,
        asdict(cfg),
        specs_for(cfg),
        "masklab.lab.studies.vision:run_one",
        out,
        jobs=jobs,
        paper=PAPER,
        progress=progress,
    )
    if dist.is_main():
        report(results, Path(out), command)
    return results


def report(results: dict, out: Path, command: str) -> None:
    figures = ["vision_test_acc.png", "vision_locality.png", "vision_attention_step0.png"]
    plot_curves(results["runs"], "test_acc", out / figures[0], ylabel="test top-1 (%)", title="Test accuracy")
    plot_curves(
        results["runs"], "local_mass", out / figures[1], ylabel="mass on 3x3 neighbourhood", title="Attention locality"
    )
    plot_attention(results, out / figures[2])
    notes = NOTES + "\n\nOurs beside the paper:\n\n" + paper_table(results)
    write_markdown(results, out, TABLE_METRICS, command, notes, figures)
