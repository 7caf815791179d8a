"""Priors without an oracle: derive the mask from causal interventions, then train with it.

For each task the structure is derived from evidence on the *training domain only*
(:mod:`masklab.priors.structures_from_evidence`). Boolean (GOTU) tasks, from one of two sources
(``--source``):

* ``function`` (default): the target queried on the seen points; pairwise mixed differences
  give the interaction graph, pairs with no seen square are reported as not identifiable;
  the graph's pairs become the interaction groups of the task's own prior design, so the
  derived prior is built by the same builder as the hand-built one;
* ``probe``: a dense model trained for ``--probe-fraction`` of the main steps; each key is
  hidden from each query with a ``-inf`` logit bias and the change of that query's output
  is thresholded row by row into a ``(T, T)`` structure used in every block; pairs of keys
  hidden at CLS give the probe's second-order effects.

``arith`` (addition), ``vision`` and ``lm``: always a probe, the task study's own model trained
on its training data with its loss and recipe for ``--probe-fraction`` of its steps; arith
measures the result-emitting queries (a causal structure; report: digit alignment and the
carry links below the place below), vision every query (report: locality), the lm
``--probe-rows`` queries averaged per query-key offset (a distance profile -> a Toeplitz band).

Then the task study's run function (one training loop, :mod:`masklab.lab.train`) trains
``vanilla``, ``mask`` (hand-built prior), ``mask-derived`` and ``mask-shuffled`` (the derived
structure's entries placed at random inside the region the derivation could fill, same
density, one shuffle per seed: the control that shows the structure matters, not the
sparsity).

Writes, besides the usual results: ``derivation.json`` (per task: effects, identifiability
verdicts with reasons, agreement of derived vs hand structure, the task's report, cost:
function queries or probe steps / forward passes, and seconds, next to the training budget)
and ``structures_<task>.png`` (hand, derived, shuffled side by side; lm: and the profile).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from masklab.util import device as devices
from masklab.lab import distributed
from masklab.util.flags import check_ranges, flag, strength_flag
from masklab.models import GPT, TokenEncoder, ViT
from masklab.lab.report import save_figure, write_markdown
from masklab.lab.runner import MasklabError, RunSpec, run_study, seed_everything, write_json
from masklab.priors.structures import (
    DESIGNS,
    causal,
    design_structure,
    locality_2d,
    neighbourhood_2d,
    relative_distance,
)
from masklab.priors.structures_from_evidence import (
    UNIDENTIFIABLE_POLICIES,
    agreement,
    derived_groups,
    from_interventions,
    offset_profile,
    probe_effects,
    probe_pair_effects,
    shuffled,
    significant,
    to_structure,
    toeplitz_structure,
)
from masklab.lab.studies import arith, gotu, lm, vision
from masklab.lab.tasks.arithmetic import IGNORE, OPS, VOCAB, inputs_targets, make_split
from masklab.lab.tasks.boolean import DIM, TASKS, make_task
from masklab.lab.tasks.vision import DATASETS, augment, normalise
from masklab.lab.tasks.text import CORPORA
from masklab.lab.train import Recipe, train

NAME = "evidence-prior"
# run_one is the task study's own run function (gotu, arith, vision, lm: each moves its model and
# data to the run's device); the derivation's probe trains and is measured on the command's device
DEVICES = ("cpu", "cuda")
PRECISIONS = (
    "fp32",
    "bf16",
    "fp16",
)  # its training and evaluation run under masklab.util.device.autocast (masklab/lab/train.py)
METHODS = ("vanilla", "mask", "mask-derived", "mask-shuffled")
SOURCES = ("function", "probe")
#: tasks of other studies: their data, model, recipe and run function; the structure comes from a probe
STUDY_TASKS = ("arith", "vision", "lm")
ALL_TASKS = (*TASKS, *STUDY_TASKS)
#: per study, the columns of the results table
METRICS = {
    "gotu": ["unseen_acc", "full_acc", "u", "unseen_mse", "train_mse", "steps_to_99", "prior_mass_all_final"],
    "arith": ["exact_acc", "exact_acc_first_eval", "digit_acc", "steps_to_90", "prior_mass_final"],
    "vision": ["test_acc", "test_loss", "local_mass_final"],
    "lm": ["val_ppl", "steps_to_target", "train_loss"],
}
TABLE_METRICS = METRICS["gotu"]
#: default probe points (inputs the hidings are averaged over) per study: vision and lm have
#: more hidings per input (17 x 17; 8 query rows x up to 64 keys), so fewer inputs keep the
#: probe near 10% of a run's compute
PROBE_POINTS = {"gotu": 256, "arith": 256, "vision": 64, "lm": 32}


@dataclass
class Config:
    """What to derive and train. The Boolean tasks use the gotu study's model and loop with the
    fields below; ``arith``, ``vision`` and ``lm`` use their own study's model, data and recipe
    (its config defaults), with ``--steps``/``--evals`` when given."""

    tasks: list[str] = flag(
        factory=lambda: ["cyclic3", "maj3", "2parity"],
        name="--task",
        help=f"comma-separated tasks ({', '.join(ALL_TASKS)})",
    )
    methods: list[str] = flag(
        factory=lambda: list(METHODS), name="--method", help=f"comma-separated methods ({', '.join(METHODS)})"
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    op: str = flag("add", choices=OPS, help="--task arith: the operation")
    fraction: float = flag(0.004, above=0, below=1, help="--task arith: training fraction of all operand pairs")
    data: str = flag("digits", choices=DATASETS, help="--task vision: the data set")
    corpus: str = flag("pydoc", choices=CORPORA, help="--task lm: the corpus")
    source: str = flag(
        "function",
        choices=SOURCES,
        help="Boolean tasks' evidence: the target on the seen points, or a briefly trained dense probe model "
        "(arith, vision, lm: always a probe)",
    )
    threshold: float = flag(
        0.05,
        min=0,
        below=1,
        help="an effect counts when above this fraction of the largest effect "
        "(of the row, for a probe; of the offset profile, for lm)",
    )
    top_k: int | None = flag(
        None,
        min=1,
        help="probe: keep each query's K largest effects (lm: the K largest offsets) instead of the threshold",
        default_text="threshold",
    )
    unidentifiable: str = flag(
        "allow",
        choices=UNIDENTIFIABLE_POLICIES,
        help="function source: a pair the seen domain cannot measure, between two variables that have effects, "
        "is allowed or dropped",
    )
    probe_fraction: float = flag(
        0.1, above=0, max=1, help="probe: probe training steps as a fraction of the main training steps"
    )
    probe_points: int | None = flag(
        None,
        min=1,
        help="probe: training inputs the hidings are averaged over",
        default_text="256; vision 64; lm 32 windows",
    )
    probe_rows: int = flag(
        8, min=1, help="--task lm: query positions the probe measures (evenly spaced, the last included)"
    )
    derive_only: bool = flag(
        False, help="derive and report the structures (derivation.json, figures, derivation.md) without training"
    )
    design: str | None = flag(
        None,
        choices=sorted(DESIGNS),
        help="Boolean tasks: prior design of mask and mask-derived",
        default_text="the task's own",
    )
    allowed: float = strength_flag(6.0)
    suppressed: float = 6.0
    width: int = flag(64, min=1, help="Boolean tasks: model width")
    depth: int = flag(2, min=1, help="Boolean tasks: transformer blocks")
    heads: int = flag(4, min=1, help="Boolean tasks: attention heads")
    steps: int | None = flag(
        None,
        min=1,
        help="training steps",
        default_text="the task's study: Boolean 1500, arith 2500, vision 1000, lm 1000",
    )
    batch: int = flag(128, min=1, help="Boolean tasks: batch size")
    lr: float = flag(1e-3, above=0, help="Boolean tasks: learning rate (AdamW)")
    weight_decay: float = flag(
        0.0,
        min=0,
        help="Boolean tasks: AdamW weight decay on linear weights and token embeddings "
        "(never positions, biases, norms or priors)",
    )
    evals: int = flag(10, min=1, help="evaluations during training")


BOOLEAN_STEPS = 1500


def quick_config() -> Config:
    return Config(tasks=["cyclic3"], seeds=[0], steps=600, evals=6)


# reproduce: cyclic3 and maj3 (gotu's 1500 steps), arith add-0.4% (2500), vision digits (1000) and
# lm pydoc (1000), 4 methods x 3 seeds = 60 runs. Estimated from measured CPU-seconds per run
# (Boolean 1500 steps 70-83, arith 70-73, vision ~60, lm ~50-60, probes 15-25):
# about 4000-4300 CPU-s, i.e. about 34-38 min with 2 jobs on an idle 2-core CPU (an estimate; the
# full reproduce was not run). 2parity is not trained (no method extrapolates on it; its
# verdicts come from `--derive-only`).


def reproduce_config() -> Config:
    return Config(tasks=["cyclic3", "maj3", "arith", "vision", "lm"], steps=None, evals=10)


def study_of(task: str) -> str:
    """The study whose run function trains ``task``: ``gotu`` for the Boolean tasks."""
    return "gotu" if task in TASKS else task


def task_label(cfg: Config, task: str) -> str:
    """The task column of the results: ``cyclic3``, ``add-0.4%``, ``digits``, ``pydoc``."""
    return {"arith": arith.task_name(cfg.op, cfg.fraction), "vision": cfg.data, "lm": cfg.corpus}.get(task, task)


def study_params(cfg: Config, task: str) -> dict:
    """The run parameters of ``task`` without a method: the gotu fields of this config for a
    Boolean task, else the task study's config defaults (its model and recipe) with this
    config's task choice, ``--steps``, ``--evals`` and strengths."""
    study = study_of(task)
    if study == "gotu":
        p = {
            k: getattr(cfg, k)
            for k in (
                "design",
                "allowed",
                "suppressed",
                "width",
                "depth",
                "heads",
                "batch",
                "lr",
                "weight_decay",
                "evals",
            )
        }
        p.update(
            {
                "function": None,
                "seen": None,
                "support": None,
                "n_vars": DIM,
                "task": task,
                "steps": cfg.steps or BOOLEAN_STEPS,
            }
        )
    elif study == "arith":
        p = {
            k: v
            for k, v in asdict(arith.Config()).items()
            if k not in ("ops", "add_fractions", "mul_fractions", "methods", "seeds")
        }
        p.update({"op": cfg.op, "fraction": cfg.fraction})
    elif study == "vision":
        p = {k: v for k, v in asdict(vision.Config(data=cfg.data)).items() if k not in ("methods", "seeds")}
    else:
        p = {k: v for k, v in asdict(lm.Config(corpus=cfg.corpus)).items() if k not in ("methods", "seeds")}
    if study != "gotu":
        p.update(
            {
                "evals": cfg.evals,
                "allowed": cfg.allowed,
                "suppressed": cfg.suppressed,
                **({"steps": cfg.steps} if cfg.steps else {}),
            }
        )
    p["study"] = study
    return p


def study_method(study: str, method: str) -> str:
    """The run function's method: ``mask`` for every prior; no prior is vision's ``default``."""
    if method != "vanilla":
        return "mask"
    return "default" if study == "vision" else "vanilla"


def hand_structures(p: dict) -> list[torch.Tensor]:
    """The task study's own hand-built prior, one ``(H|1, T, T)`` per block."""
    study = p["study"]
    if study == "arith":
        return arith.structures_for({**p, "structures": None})
    if study == "vision":
        size = vision.model_size(p)
        data = vision._data(p["data"], p["data_dir"], p["image_size"])
        return [locality_2d(data.image_size // size["patch"], size["heads"], p["radius"])] * size["depth"]
    if study == "lm":
        return [relative_distance(p["block"], p["heads"])] * p["depth"]
    raise ValueError(f"no hand-built structure for study {study!r}")


# ----------------------------------------------------------------------------- derivation


def _probe_structure(cfg: Config, task, fx) -> tuple[torch.Tensor, dict]:
    """Train a dense probe for ``probe_fraction * steps`` steps on the seen domain (seed 0),
    hide each key from each query, threshold. Also the probe's second-order effects at CLS
    (pairs of variable keys hidden together, minus the two singles), with the pairs that the
    seen domain cannot measure (``fx``'s squares) flagged. Returns the ``(T, T)`` structure and
    the record."""
    start = time.perf_counter()
    gen = seed_everything(0)
    n = task.dim
    model = TokenEncoder(2, n, cfg.width, cfg.depth, cfg.heads)
    x_all = gotu.tokens_of(task.x)
    y_t = torch.from_numpy(task.y)
    seen_idx = torch.from_numpy(np.flatnonzero(task.seen))
    main_steps = cfg.steps or BOOLEAN_STEPS
    steps = max(1, round(cfg.probe_fraction * main_steps))

    def loss_of(net, step):  # drawn on the CPU, then moved to the probe's device (where train() puts it)
        idx = seen_idx[torch.randint(len(seen_idx), (cfg.batch,), generator=gen)]
        xb, yb = devices.to((x_all[idx], y_t[idx]), distributed.device())
        return F.mse_loss(net(xb)[0][:, 0], yb)

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        trained = train(
            model,
            Recipe(steps, cfg.lr, cfg.weight_decay, evals=1),
            loss_of,
            lambda s: {},
            gen,
            Path(tmp),
            f"{task.name}/probe",
        )
    train_seconds = time.perf_counter() - start
    points = x_all[seen_idx[torch.randperm(len(seen_idx), generator=gen)[: cfg.probe_points or PROBE_POINTS["gotu"]]]]
    pe = probe_effects(model, points)
    s = to_structure(pe.effects, cfg.threshold, cfg.top_k)
    n = task.dim
    pp = probe_pair_effects(model, points, row=0, keys=list(range(1, n + 1)))
    inter = pp.pair[1:, 1:]  # (n, n) over the variables
    on = significant(np.abs(inter), cfg.threshold)
    found = [(i, j) for i in range(n) for j in range(i + 1, n) if on[i, j]]
    true = sorted({(min(a, b), max(a, b)) for g in task.groups for a in g for b in g if a != b})
    hits = len(set(found) & set(true))
    record_pairs = {
        "row": "CLS (query 0): hide variable keys x_i, x_j together; "
        "interaction = change(pair) - change(x_i) - change(x_j)",
        "interaction": np.round(np.nan_to_num(inter, nan=0.0), 5).tolist(),
        "pairs": [list(q) for q in found],
        "true_pairs": [list(q) for q in true],
        "precision": hits / max(1, len(found)),
        "recall": hits / max(1, len(true)),
        "unidentifiable": [
            {
                "pair": [i, j],
                "probe_interaction": round(float(inter[i, j]), 5),
                "reason": f"no seen point has all four corners of the (x{i}, x{j}) square in the seen domain: "
                "the probe's value there is how it extrapolates, not evidence",
            }
            for i, j in fx.unidentifiable()
        ],
        "forward_passes": pp.forwards,
        "seconds": pp.seconds,
    }
    record = {
        "effects": np.round(pe.effects, 4).tolist(),
        "second_order": record_pairs,
        "cost": {
            "probe_steps": steps,
            "probe_train_examples": steps * cfg.batch,
            "probe_train_seconds": train_seconds,
            "probe_train_loss": trained.curves["train_loss"][-1],
            "forward_passes": pe.forwards,
            "points_per_forward": pe.points,
            "hiding_seconds": pe.seconds,
            "pair_forward_passes": pp.forwards,
            "pair_seconds": pp.seconds,
            "seconds": train_seconds + pe.seconds + pp.seconds,
            "fraction_of_training_steps": steps / main_steps,
        },
        "identifiability": "a probe trained on the seen domain has no evidence about the unseen domain either; "
        "see the function source for the per-pair verdict",
    }
    return s, record


def _probe_setup(p: dict, steps: int, points: int, gen: torch.Generator) -> dict:
    """A dense model of the task study's size, its training loss on the study's training data
    (the probe sees what the main runs see: seed 0's training pairs, images, windows), its
    recipe shortened to ``steps``, the probe inputs, the measured rows and how they are read.
    Batches are drawn on the CPU from ``gen``, then moved to the run's device (where
    :func:`masklab.lab.train.train` puts the model)."""
    study = p["study"]
    if study == "arith":
        split = make_split(p["op"], p["width"], p["fraction"], p["test_size"], 0, p["reverse"])
        x, y = inputs_targets(split.sequences("train"), p["width"])
        model = GPT(VOCAB, x.shape[1], p["dim"], p["depth"], p["heads"])

        def loss_of(net, step):
            idx = torch.randint(len(x), (p["batch"],), generator=gen)
            xb, yb = devices.to((x[idx], y[idx]), distributed.device())
            return F.cross_entropy(net(xb)[0].flatten(0, 1), yb.flatten())

        T = x.shape[1]
        rows = np.flatnonzero((y != IGNORE).any(0).numpy()).tolist()  # the rows whose output the loss reads
        return {
            "model": model,
            "loss_of": loss_of,
            "recipe": Recipe(steps, p["lr"], p["weight_decay"], p["warmup"], floor=0.1, evals=1),
            "points": x[torch.randperm(len(x), generator=gen)[:points]],
            "rows": rows,
            "head_rows": tuple(range(T)),
            "examples": steps * p["batch"],
        }
    if study == "vision":
        data = vision._data(p["data"], p["data_dir"], p["image_size"])
        size = vision.model_size(p)
        mean, std = data.stats()
        model = ViT(
            data.image_size, size["patch"], data.channels, data.classes, size["dim"], size["depth"], size["heads"]
        )

        def loss_of(net, step):
            idx = torch.randint(len(data.train_x), (p["batch"],), generator=gen)
            xb = normalise(augment(data.train_x[idx].float(), data.pad, data.flip, gen), data, mean, std)
            xb, yb = devices.to((xb, data.train_y[idx]), distributed.device())
            return F.cross_entropy(net(xb)[0], yb)

        pts = normalise(data.train_x[torch.randperm(len(data.train_x), generator=gen)[:points]], data, mean, std)
        return {
            "model": model,
            "loss_of": loss_of,
            "recipe": Recipe(steps, p["lr"], p["weight_decay"], p["warmup"], floor=0.0, evals=1),
            "points": pts,
            "rows": None,
            "head_rows": (0,),
            "examples": steps * p["batch"],
        }
    data = lm._tokens(p["corpus"], p["data_dir"], p["max_chars"], p["tokenizer"], p["bpe_vocab"])
    T = p["block"]
    model = lm.build_model({**p, "method": "vanilla"}, data.vocab)
    offsets = torch.arange(T + 1)

    def loss_of(net, step):
        w = data.train[torch.randint(len(data.train) - T - 1, (p["batch"],), generator=gen)[:, None] + offsets]
        w = devices.to(w, distributed.device())
        return F.cross_entropy(net(w[:, :-1])[0].flatten(0, 1), w[:, 1:].flatten())

    starts = torch.randint(len(data.train) - T - 1, (points,), generator=gen)
    return {
        "model": model,
        "loss_of": loss_of,
        "recipe": Recipe(steps, p["lr"], p["weight_decay"], p["warmup"], floor=0.0, evals=1),
        "points": data.train[starts[:, None] + torch.arange(T)],
        "rows": None,
        "head_rows": tuple(range(T)),
        "examples": steps * p["batch"],
    }


def lm_rows(T: int, count: int) -> list[int]:
    """``count`` query positions evenly spaced over ``[0, T)``, ending at the last (which has every
    offset): ``lm_rows(64, 8) == [7, 15, ..., 63]``."""
    return sorted({T * (k + 1) // count - 1 for k in range(min(count, T))})


def _chebyshev(grid: int) -> np.ndarray:
    """``(P, P)`` Chebyshev distance between the patches of a ``grid x grid`` grid."""
    rc = np.stack(np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij"), -1).reshape(-1, 2)
    return np.abs(rc[:, None] - rc[None]).max(-1)


def _arith_report(s: torch.Tensor, p: dict) -> dict:
    """Digit alignment and carry of a derived arith structure ``(T, T)`` (addition): per result
    place, which operand digits the emitting query reads, split into its own place and the place
    below (what the hand prior allows) and lower places (the rest of the carry chain, which the
    plain layout needs and the hand prior misses)."""
    from masklab.priors.structures import emitting_position, operand_position, result_width

    w, rev = p["width"], p["reverse"]
    places, missing_carry, found_carry = [], 0, 0
    for place in range(result_width(w, p["op"])):
        row = emitting_position(w, p["op"], place, rev)
        digits = {(o, d): bool(s[row, operand_position(w, o, d)] > 0.5) for o in (0, 1) for d in range(w)}
        aligned = [f"{'ab'[o]}{d}" for (o, d), on in digits.items() if on and d in (place, place - 1)]
        lower = [f"{'ab'[o]}{d}" for (o, d), on in digits.items() if on and d < place - 1]
        possible = [(o, d) for (o, d) in digits if d < place - 1]
        found_carry += len(lower)
        missing_carry += len(possible) - len(lower)
        others = [k for k in range(row + 1) if s[row, k] > 0.5 and k != row and k > 2 * w]
        places.append({"place": place, "row": row, "aligned": aligned, "carry_below": lower, "other_keys": others})
    return {"places": places, "carry_links_found": found_carry, "carry_links_possible": found_carry + missing_carry}


def _study_derive(cfg: Config, task: str, p: dict) -> dict:
    """Probe-derived structure of an arith, vision or lm task and its report against the hand prior."""
    import tempfile

    study = p["study"]
    start = time.perf_counter()
    gen = seed_everything(0)
    steps = max(1, round(cfg.probe_fraction * p["steps"]))
    setup = _probe_setup(p, steps, cfg.probe_points or PROBE_POINTS[study], gen)
    model = setup["model"]
    with tempfile.TemporaryDirectory() as tmp:
        trained = train(model, setup["recipe"], setup["loss_of"], lambda s: {}, gen, Path(tmp), f"{task}/probe")
    train_seconds = time.perf_counter() - start
    T = p["block"] if study == "lm" else None
    rows = lm_rows(T, cfg.probe_rows) if study == "lm" else setup["rows"]
    pe = probe_effects(model, setup["points"], rows, setup["head_rows"], distribution=True)
    hand = hand_structures(p)
    report: dict = {}
    T = pe.effects.shape[0]
    if study == "lm":
        profile = offset_profile(pe.effects)
        prof = np.nan_to_num(profile, nan=0.0)
        if cfg.top_k is not None:
            keep = np.zeros(T, dtype=bool)
            keep[np.argsort(-prof, kind="stable")[: cfg.top_k]] = True
        else:
            keep = prof > cfg.threshold * prof.max()
        s = toeplitz_structure(keep)
        hand_profile = np.array([float(hand[0][:, d:, : T - d].diagonal(dim1=-2, dim2=-1).mean()) for d in range(T)])
        ok = np.isfinite(profile)
        rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731
        report = {
            "profile": np.round(profile, 5).tolist(),
            "hand_profile": np.round(hand_profile, 4).tolist(),
            "kept_offsets": np.flatnonzero(keep).tolist(),
            "spearman_with_hand": float(np.corrcoef(rank(profile[ok]), rank(hand_profile[ok]))[0, 1]),
            "rows": rows,
        }
        region = torch.ones(T, T).tril(-1).bool()
    else:
        s = to_structure(pe.effects, cfg.threshold, cfg.top_k)
        if study == "arith":
            s = causal(s)
            region = torch.zeros(T, T, dtype=torch.bool)
            region[rows] = torch.ones(T, T).tril(-1).bool()[rows]
            report = _arith_report(s, p)
            report["rows"] = rows
        else:
            region = ~torch.eye(T, dtype=torch.bool)
            grid = int(round((T - 1) ** 0.5))
            dist = _chebyshev(grid)
            patch = s[1:, 1:].numpy() > 0.5
            off = ~np.eye(T - 1, dtype=bool)
            within = (patch & off & (dist <= 1)).sum()
            report = {
                "patch_entries": int((patch & off).sum()),
                "within_radius_1": int(within),
                "fraction_within_radius_1": float(within / max(1, (patch & off).sum())),
                "chance_within_radius_1": float(((dist <= 1) & off).sum() / off.sum()),
                "mean_distance_derived": float(dist[patch & off].mean()) if (patch & off).any() else None,
                "mean_distance_all": float(dist[off].mean()),
                "agreement_patches_vs_3x3": agreement(s[1:, 1:], torch.tensor(neighbourhood_2d(grid, 1).numpy())),
            }
    derived = [s[None] for _ in hand]
    cost_s = train_seconds + pe.seconds
    return {
        "task": task_label(cfg, task),
        "study": study,
        "source": "probe",
        "effects": np.round(np.nan_to_num(pe.effects, nan=-1.0), 5).tolist(),
        "report": report,
        "cost": {
            "probe_steps": steps,
            "probe_train_examples": setup["examples"],
            "probe_train_seconds": train_seconds,
            "probe_train_loss": trained.curves["train_loss"][-1],
            "forward_passes": pe.forwards,
            "points_per_forward": pe.points,
            "hiding_seconds": pe.seconds,
            "seconds": cost_s,
            "fraction_of_training_steps": steps / p["steps"],
        },
        "verdicts": None,
        "agreement": [agreement(d, h) for d, h in zip(derived, hand)],
        "training_budget": {"steps": p["steps"], "batch": p["batch"], "examples": p["steps"] * p["batch"]},
        "hand": [h.tolist() for h in hand],
        "derived": [d.tolist() for d in derived],
        "shuffle_region": region.int().tolist(),
    }


def derive(cfg: Config, task_name: str) -> dict:
    """The hand-built and derived structures of one task (one ``(H|1, T, T)`` per block) and
    the derivation record (effects, verdicts, agreement, cost)."""
    if task_name in STUDY_TASKS:
        return _study_derive(cfg, task_name, study_params(cfg, task_name))
    task = make_task(task_name, DIM)
    n, design = task.dim, cfg.design or task.default_design
    hand = [design_structure(design, task.groups, n, layer, cfg.depth, cfg.heads) for layer in range(cfg.depth)]
    # the verdicts are reported for both sources
    from_fn, inter, fx = from_interventions(
        task.y, task.seen, DESIGNS[design], cfg.depth, cfg.heads, cfg.threshold, cfg.unidentifiable
    )
    verdicts = {
        "identified_pairs": [list(p) for p in inter.pairs],
        "unidentifiable": [{"pair": [i, j], "reason": r} for i, j, r in inter.unidentifiable],
        "assumed_pairs": [list(p) for p in inter.assumed],
        "policy": cfg.unidentifiable,
        "variables": inter.variables,
    }
    if cfg.source == "function":
        groups = derived_groups(inter)
        derived = from_fn
        record = {
            "first_order": np.round(fx.first, 4).tolist(),
            "pair_effects": np.round(np.nan_to_num(fx.pair, nan=-1.0), 4).tolist(),
            "groups": [list(g) for g in groups],
            "cost": {
                "function_queries": fx.queries,
                "seconds": fx.seconds,
                "note": "each seen point's target read once: no labels beyond the training set",
            },
        }
    else:
        s, record = _probe_structure(cfg, task, fx)
        derived = [s[None] for _ in range(cfg.depth)]
    record.update(
        {
            "task": task_name,
            "source": cfg.source,
            "design": design,
            "verdicts": verdicts,
            "agreement": [agreement(d, h) for d, h in zip(derived, hand)],
            "study": "gotu",
            "training_budget": {
                "steps": cfg.steps or BOOLEAN_STEPS,
                "batch": cfg.batch,
                "examples": (cfg.steps or BOOLEAN_STEPS) * cfg.batch,
            },
            "hand": [h.tolist() for h in hand],
            "derived": [d.tolist() for d in derived],
        }
    )
    return record


def shuffled_structures(derived: list[list], seed: int, region: list | None = None) -> list[list]:
    """Each block's ``(H|1, T, T)`` derived structure with every head shuffled (:func:`shuffled`)
    within ``region`` (``(T, T)`` 0/1; default: off the diagonal)."""
    r = None if region is None else torch.tensor(region, dtype=torch.bool)
    out = []
    for layer, s in enumerate(derived):
        t = torch.tensor(s)
        out.append(torch.stack([shuffled(t[h], 1000 * seed + 10 * layer + h, r) for h in range(t.shape[0])]).tolist())
    return out


# ----------------------------------------------------------------------------- study


def specs_for(cfg: Config, records: dict[str, dict]) -> list[RunSpec]:
    specs = []
    for task in cfg.tasks:
        base = study_params(cfg, task)
        rec = records[task]
        for method in cfg.methods:
            for seed in cfg.seeds:
                p = {**base, "method": study_method(base["study"], method), "structures": None}
                if method == "mask-derived":
                    p["structures"] = rec["derived"]
                elif method == "mask-shuffled":
                    p["structures"] = shuffled_structures(rec["derived"], seed, rec.get("shuffle_region"))
                specs.append(RunSpec(task_label(cfg, task), method, seed, p))
    return specs


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    """Train one run with its task study's run function (gotu, arith, vision or lm); arith's
    runs also report ``exact_acc_first_eval``, the held-out exact accuracy at the first
    evaluation after step 0 (the early-training speed the arith study reports)."""
    study = spec["params"]["study"]
    fn = {"gotu": gotu.run_one, "arith": arith.run_one, "vision": vision.run_one, "lm": lm.run_one}[study]
    out = fn(spec, ckpt_dir)
    if study == "arith":
        out["metrics"]["exact_acc_first_eval"] = out["curves"]["test_exact_acc"][1]
    return out


def validate(cfg: Config) -> None:
    check_ranges(cfg)  # the ranges declared on the flags (--fraction, --threshold, --steps, ...)
    for t in cfg.tasks:
        if t not in ALL_TASKS:
            raise MasklabError(f"unknown task {t!r}; choose from {', '.join(ALL_TASKS)}")
    for m in cfg.methods:
        if m not in METHODS:
            raise MasklabError(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    if cfg.source not in SOURCES:
        raise MasklabError(f"unknown --source {cfg.source!r}; choose from {', '.join(SOURCES)}")
    if cfg.unidentifiable not in UNIDENTIFIABLE_POLICIES:
        raise MasklabError(
            f"unknown --unidentifiable {cfg.unidentifiable!r}; choose from {', '.join(UNIDENTIFIABLE_POLICIES)}"
        )
    if not 0 <= cfg.threshold < 1:
        raise MasklabError("--threshold must be in [0, 1)")
    if cfg.top_k is not None and cfg.top_k < 1:
        raise MasklabError("--top-k must be at least 1")
    if not 0 < cfg.probe_fraction <= 1 or (cfg.probe_points is not None and cfg.probe_points < 1):
        raise MasklabError("--probe-fraction must be in (0, 1] and --probe-points positive")
    if (cfg.steps is not None and cfg.steps < 1) or cfg.batch < 1 or cfg.lr <= 0 or cfg.evals < 1:
        raise MasklabError("--steps, --batch and --evals must be positive and --lr > 0")
    if cfg.probe_rows < 1:
        raise MasklabError("--probe-rows must be at least 1")
    if "arith" in cfg.tasks:
        if cfg.op != "add":
            raise MasklabError(
                "--task arith derives addition only (--op add): the carry report is written for addition"
            )
        arith.validate(
            arith.Config(
                ops=[cfg.op], add_fractions=[cfg.fraction], methods=["vanilla"], steps=cfg.steps or arith.Config().steps
            )
        )
    if "vision" in cfg.tasks:
        vision.validate(vision.Config(data=cfg.data, methods=["default"]))
    if "lm" in cfg.tasks:
        lm.validate(lm.Config(corpus=cfg.corpus, methods=["vanilla"]))


def plot_structures(record: dict, path: Path) -> None:
    """Hand, derived and one shuffled structure (block 0, union over heads) side by side; for
    the lm, also the derived effect per query-key offset beside the hand prior's mean over heads."""
    shuf = shuffled_structures(record["derived"], 0, record.get("shuffle_region"))[0]
    panels = [("hand-built", record["hand"][0]), ("derived", record["derived"][0]), ("shuffled (seed 0)", shuf)]
    profile = record.get("report", {}).get("profile")
    fig, axes = plt.subplots(1, 3 + bool(profile), figsize=(11 + 3.7 * bool(profile), 3.8))
    xlabel = {"gotu": "key (0 = CLS, i+1 = x_i)", "vision": "key (0 = CLS, then patches row by row)"}.get(
        record["study"], "key position"
    )
    for ax, (title, s) in zip(axes, panels):
        ax.imshow(np.asarray(s).max(0), cmap="Greys", vmin=0, vmax=1)
        ax.set_title(f"{record['task']}: {title}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("query")
    if profile:
        prof = np.asarray(profile, dtype=float)
        ax = axes[3]
        ax.plot(prof / np.nanmax(prof), label="derived effect (scaled to max 1)")
        ax.plot(record["report"]["hand_profile"], label="hand prior S, mean over heads")
        ax.set_xscale("symlog")
        ax.set_xlabel("offset i - j")
        ax.legend(fontsize=7)
        ax.set_title("per offset")
    save_figure(fig, path)


NOTES = """Methods: `vanilla` no prior (vision: the ViT's `default` init); `mask` the hand-built prior
(Boolean: the task's design over its known groups; arith: digit alignment; vision: 2-D
locality; lm: relative distance); `mask-derived` the prior built from the derived structure
(Boolean, function source: the same design over the derived groups; probe: the thresholded
"query i needs key j" matrix, shared by every head and block; lm: the kept query-key offsets);
`mask-shuffled` the derived structure with its allowed entries moved to random places of the
region the derivation could fill (off the diagonal; causal tasks: below it, in the measured
rows), same count, one shuffle per seed. Columns are the task study's own (`masklab gotu`,
`arith`, `vision`, `lm`); `exact_acc_first_eval` is arith's held-out exact accuracy (1000
pairs) at the first evaluation after step 0 (its early-training speed)."""


def _derivation_md(records: dict[str, dict], results: dict) -> str:
    seconds = {}
    for r in results["runs"]:
        seconds.setdefault(r["task"], []).append(r.get("seconds") or 0.0)
    lines = [
        "",
        "## Derivation",
        "",
        "| task | source | precision | recall | jaccard | "
        "allowed (derived / hand) | cost | derive s | mean train s per run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rec in records.values():
        task = rec["task"]
        a = rec["agreement"][0]
        c = rec["cost"]
        cost = (
            f"{c['function_queries']} function queries (seen points) "
            f"vs {rec['training_budget']['examples']} training examples"
            if "function_queries" in c
            else f"{c['probe_steps']} probe steps "
            f"({c['fraction_of_training_steps']:.0%} of {rec['training_budget']['steps']}) "
            f"+ {c['forward_passes']} forwards x {c['points_per_forward']} points"
        )
        train_s = f"{np.mean(seconds[task]):.1f}" if task in seconds else "-"
        lines.append(
            f"| {task} | {rec['source']} | {a['precision']:.3f} | {a['recall']:.3f} | {a['jaccard']:.3f} | "
            f"{a['allowed_derived']} / {a['allowed_hand']} | {cost} | {c['seconds']:.2f} | {train_s} |"
        )
    lines += ["", "Agreement is over block 0's allowed entries (union over heads).", ""]
    for rec in records.values():
        task, v, rep = rec["task"], rec["verdicts"], rec.get("report") or {}
        if v is None:
            pass
        elif v["unidentifiable"]:
            pairs = ", ".join(f"(x{u['pair'][0]}, x{u['pair'][1]})" for u in v["unidentifiable"])
            lines.append(
                f"* {task}: not identifiable: {pairs}: {v['unidentifiable'][0]['reason']} "
                "(the target on the seen domain); "
                f"policy `{v['policy']}` -> {'allowed' if v['assumed_pairs'] else 'dropped'} in the derived structure."
            )
        else:
            lines.append(
                f"* {task}: every pair is identifiable from the seen domain "
                f"({len(v['identified_pairs'])} interacting pairs found)."
            )
        so = rec.get("second_order")
        if so:
            unid = "; ".join(
                f"(x{u['pair'][0]}, x{u['pair'][1]}) not identifiable (probe value {u['probe_interaction']})"
                for u in so["unidentifiable"]
            )
            lines.append(
                f"* {task}: probe second-order pairs at CLS: {len(so['pairs'])} found, "
                f"precision {so['precision']:.3f}, "
                f"recall {so['recall']:.3f} against the target's {len(so['true_pairs'])} pairs"
                + (f"; {unid}" if unid else "")
                + "."
            )
        if "carry_links_found" in rep:
            per = "; ".join(
                f"place {q['place']}: aligned {','.join(q['aligned']) or '-'}, "
                f"lower {','.join(q['carry_below']) or '-'}"
                + (f", other keys {q['other_keys']}" if q["other_keys"] else "")
                for q in rep["places"]
            )
            lines.append(
                f"* {task}: carry links beyond the place below (which the hand prior lacks): "
                f"{rep['carry_links_found']} of {rep['carry_links_possible']} derived ({per})."
            )
        if "fraction_within_radius_1" in rep:
            lines.append(
                f"* {task}: {rep['patch_entries']} patch-to-patch entries, "
                f"{rep['fraction_within_radius_1']:.2f} of them within the "
                f"3x3 neighbourhood (chance {rep['chance_within_radius_1']:.2f}); "
                f"mean Chebyshev distance {rep['mean_distance_derived'] or float('nan'):.2f} "
                f"vs {rep['mean_distance_all']:.2f} for all pairs."
            )
        if "kept_offsets" in rep:
            lines.append(
                f"* {task}: kept offsets {rep['kept_offsets']} (measured rows {rep['rows']}); "
                "Spearman correlation of the "
                f"derived per-offset effect with the hand prior's mean S: {rep['spearman_with_hand']:.3f}."
            )
    return "\n".join(lines) + "\n"


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab evidence-prior") -> dict:
    validate(cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the derivation runs in this process: one thread, like every training run
    try:
        records = {t: derive(cfg, t) for t in cfg.tasks}
    finally:
        torch.set_num_threads(threads)
    write_json(out / "derivation.json", records)
    for t, rec in records.items():
        plot_structures(rec, out / f"structures_{t}.png")
    if cfg.derive_only:
        text = f"# {NAME}: derivation only\n\nCommand: `{command}`\n" + _derivation_md(records, {"runs": []})
        (out / "results.md").write_text(text)
        results = {"study": NAME, "config": asdict(cfg), "runs": [], "summary": [], "derivation": records}
        write_json(out / "results.json", results)
        return results
    results = run_study(
        NAME,
        asdict(cfg),
        specs_for(cfg, records),
        "masklab.lab.studies.evidence_prior:run_one",
        out,
        jobs=jobs,
        progress=progress,
    )
    figures = [f"structures_{t}.png" for t in cfg.tasks]
    studies = list(dict.fromkeys(study_of(t) for t in cfg.tasks))
    metrics = list(dict.fromkeys(m for st in studies for m in METRICS[st]))
    write_markdown(results, out, metrics, command, NOTES, figures)
    with open(out / "results.md", "a") as fh:
        fh.write(_derivation_md(records, results))
    return results
