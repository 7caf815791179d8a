"""Study B, second half: routers trained on causal evidence vs attention vs gold, sparse inference.

Per gym (``multihop`` at each ``--hops``, ``stale``, ``kv``, ``aggregate``):

1. **prepare** (one run per gym x seed): the seed's dense teacher (trained from that seed,
   so the spread over seeds includes teacher-to-teacher variance; cached, shared with
   ``masklab evidence --seeds``: same settings, same cache key; ``--no-teacher-per-seed``
   shares the ``teacher_seed`` teacher) and a *pool* of ``pool`` training examples with
   ``items / 2 .. items`` items and every training target computed once with that teacher:
   ``gold``, ``causal`` (= ``loo`` leave-one-out evidence of the teacher's dense answer),
   ``attention`` (= ``last-mean/topk`` with k = ``attention_k``, a fixed fraction of each
   context by default: the items with the highest last-layer attention from the query),
   ``attention-gold-k`` (the same with k = the gold evidence size, which a deployed router
   never knows), or any other name of :func:`masklab.lab.evidence.targets.target_names`
   (``<aggregate>/topk`` there means k = gold size). One pool per (gym, seed) serves every
   target, so the targets differ and nothing else does.
2. **routers** (one run per gym x target x seed): the same router, trained for the same
   number of steps on the same pool, only the target column differs
   (:func:`masklab.lab.routing.train.train_router`); the ``independent`` router (items scored
   without seeing each other) is trained on ``independent_targets``.
3. **evaluation** at ``lengths`` x N items (the router is trained at N only; the teacher
   reads up to 4N): keep the top items by each router and by each baseline (``dense``,
   ``random``, ``recent``, ``teacher-attention`` = SnapKV-style selection from the teacher's
   own dense pre-fill, ``oracle-gold``), let the teacher answer from the kept items only
   (dropping the others), at the headline ``budget``, at the headline ``fractions`` of the
   context (10% and 25%: budgets that need no gold size) and along the ``budgets`` curve.

Metrics (means over ``examples`` fresh held-out examples): ``acc_<m>x`` accuracy of the
teacher's answer from the kept items at m x N items (headline budget), ``recall_<m>x``
fraction of gold evidence kept, ``acc_<m>x@<b>`` / ``recall_<m>x@<b>`` along the budget
curve, ``flops_ratio_<m>x`` (router + sparse teacher) / dense teacher FLOPs by formula,
``speedup_<m>x`` measured dense / (router + sparse teacher) wall-clock on the eval batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from masklab.lab.evidence.attention_targets import aggregate_fn
from masklab.lab.evidence.interventions import answer_logits
from masklab.lab.evidence.targets import target_masks, target_names
from masklab.lab.evidence.teacher import (
    MIN_TEACHER_ACC,
    MIN_TEACHER_ACC_HELP,
    TeacherConfig,
    gym_of,
    load_or_train,
    untrained_note,
    untrained_teachers,
    warn_untrained,
)
from masklab.lab.studies import evidence
from masklab.lab.studies.evidence import task_label
from masklab.lab.report import environment_line, markdown_table, save_figure
from masklab.lab.routing.routers import build_router
from masklab.lab.routing.sparse import (
    SELECTORS,
    AttentionSelector,
    budget_k,
    budget_label,
    keep_mask,
    parse_budget,
    router_scores,
    teacher_answer,
    teacher_flops,
)
from masklab.lab.routing.train import LOSSES, train_router
from masklab.util.errors import MasklabError, check_choices
from masklab.util.flags import flag, list_or_none
from masklab.util.files import atomic_write_text, write_json
from masklab.lab.runner import RunSpec, add_stats, run_study, summarize
from masklab.lab.tasks.evidence_gyms import GYMS, EvidenceBatch

NAME = "routing"
# run_one trains its teacher and routers on the run's device (pools, examples, selections and
# metrics stay on the CPU; forward passes move their inputs there)
DEVICES = ("cpu", "cuda")

# docs/papers.md, Study B, multi-hop retrieval: the teacher answering from the items a
# router keeps. Only these three numbers are stated; nothing else is compared numerically.
PAPER = [
    {"task": "multihop-h2", "method": "router/attention", "metric": "acc", "value": 0.41},
    {"task": "multihop-h2", "method": "router/causal", "metric": "acc", "value": 0.99},
    {"task": "multihop-h2", "method": "dense", "metric": "acc", "value": 0.99},
]

# short names for the training targets of the paper; `attention` takes its k from --attention-k,
# `attention-gold-k` from the gold evidence size (see target_spec)
TARGET_ALIASES = {"causal": "loo", "attention": "last-mean/topk", "attention-gold-k": "last-mean/topk"}
BASELINES = ("dense", "random", "recent", "teacher-attention", "oracle-gold")  # selectors (routing.sparse.SELECTORS)


@dataclass
class Config:
    """Gyms, teacher (same fields as ``masklab evidence``, so teachers are shared), routers, evaluation."""

    tasks: list[str] = flag(
        factory=lambda: ["multihop", "stale", "kv", "aggregate"],
        name="--task",
        help=f"comma-separated gyms ({', '.join(GYMS)})",
    )
    hops: list[int] = flag(factory=lambda: [2, 3], help="multihop chain length(s), comma-separated")
    updates: int = flag(2, help="stale: assignments of the queried key")
    items: int = flag(16, help="items per context N the routers are trained at")
    vocab: int = flag(256, help="number of symbols")
    tags: int = 8
    max_count: int = 4
    targets: list[str] = flag(
        factory=lambda: ["gold", "causal", "attention"],
        help="comma-separated router targets: causal, attention, attention-gold-k, gold, or any evidence target name",
    )
    attention_k: str = flag(
        "25%",
        help="k of the `attention` target (last-layer top-k attention): items (3), a fraction of "
        "each context (25%) or gold (the gold evidence size; the `attention-gold-k` target)",
    )
    independent_targets: list[str] = flag(
        factory=lambda: ["causal"],
        name="--independent",
        parse=list_or_none,
        help="targets for the independent (no item interaction) router; 'none' for none",
    )
    router_dim: int = flag(32, help="router width")
    router_depth: int = flag(3, help="router blocks")
    router_heads: int = flag(4, help="router heads")
    length_scale: bool = flag(
        True, help="log-n query scaling in the router (--no-length-scale: a length-generalisation factor)"
    )
    router_steps: int = flag(2500, help="router training steps")
    router_batch: int = 64
    router_lr: float = flag(2e-3, help="router learning rate")
    loss: str = flag("bce", choices=LOSSES, help="router training loss")
    pool: int = flag(24000, help="training examples per (gym, seed), targets computed once")
    budget: str = flag("gold", help="headline budget: items (3), fraction (10%) or gold (the gold evidence size)")
    fractions: list[str] = flag(
        factory=lambda: ["10%", "25%"],
        parse=list_or_none,
        help="headline budgets at fixed fractions of the context, reported beside --budget "
        "(they need no gold size); 'none' for none",
    )
    budgets: list[str] = flag(
        factory=lambda: ["1", "2", "3", "4", "6", "8", "10%"], help="comma-separated budget curve"
    )
    lengths: list[int] = flag(factory=lambda: [1, 2, 4], help="evaluate at these multiples of N")
    baselines: list[str] = flag(
        factory=lambda: list(BASELINES),
        parse=list_or_none,
        help=f"comma-separated baselines ({', '.join(BASELINES)}) or 'none'",
    )
    snap_aggregate: str = flag("layer-mean", help="attention aggregate of the teacher-attention baseline")
    examples: int = flag(500, help="held-out examples per length")
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    # teacher (see masklab.lab.evidence.teacher.TeacherConfig)
    dim: int = 64
    depth: int = 4
    heads: int = 4
    teacher_steps: int | None = flag(
        None, help="teacher training steps for every gym", default_text=evidence.teacher_steps_default()
    )
    teacher_batch: int = 64
    teacher_lr: float = 2e-3
    max_factor: int = 4
    aux: float = flag(0.0, help="auxiliary hop loss of multihop teachers (0 = off; it shapes the attention targets)")
    teacher_per_seed: bool = flag(
        True,
        help="one teacher per seed, trained from that seed (--no-teacher-per-seed: every "
        "seed shares the teacher of seed teacher_seed, which hides teacher-to-teacher variance)",
    )
    teacher_seed: int = 0
    mode: str = "delete"
    cache: str = flag("cache", help="teacher and pool cache directory")
    min_teacher_acc: float = flag(
        MIN_TEACHER_ACC, help=MIN_TEACHER_ACC_HELP
    )  # read at report time, not a run parameter


def quick_config() -> Config:
    # two gyms at N = 8, short-trained teachers and routers: shows the pipeline in about a minute
    return Config(
        tasks=["multihop", "stale"],
        hops=[2],
        items=8,
        vocab=64,
        teacher_steps=1200,
        depth=3,
        max_factor=2,
        router_steps=1000,
        pool=3000,
        examples=200,
        seeds=[0],
        lengths=[1, 2],
        budgets=["1", "2", "4"],
        independent_targets=[],
    )


def reproduce_config() -> Config:
    # both attention targets: k a fixed fraction (attention) and k = gold size (attention-gold-k)
    return Config(targets=["gold", "causal", "attention", "attention-gold-k"])


def resolve_target(name: str) -> str:
    return TARGET_ALIASES.get(name, name)


def target_spec(name: str, p: dict) -> tuple[str, str]:
    """``(evidence target name, k)`` of a router target; k is a budget (``"gold"``: the gold size),
    used by ``<aggregate>/topk`` targets only."""
    return resolve_target(name), (p["attention_k"] if name == "attention" else "gold")


def target_key(name: str, p: dict) -> str:
    """The pool column of a router target: ``last-mean/topk`` (k = gold size) or ``last-mean/topk@25pct``."""
    target, k = target_spec(name, p)
    return target if k == "gold" or not target.endswith("/topk") else f"{target}@{budget_label(parse_budget(k))}"


def teacher_seed_of(p: dict, seed: int) -> int:
    """The teacher of run seed ``seed``: trained from that seed, or the shared ``teacher_seed``."""
    return seed if p["teacher_per_seed"] else p["teacher_seed"]


def teacher_config(p: dict, task: str, hops: int, seed: int) -> TeacherConfig:
    """The evidence study's teacher for this gym and run seed (same recipe, same cache key)."""
    return evidence.teacher_config(p, task, hops, teacher_seed_of(p, seed))


# ----------------------------------------------------------------------------- pools

POOL_FIELDS = ("items", "valid", "positions", "query", "answer", "gold", "hops")


def pool_path(p: dict, task: str, hops: int, seed: int) -> Path:
    raw = json.dumps(
        {
            "teacher": teacher_config(p, task, hops, seed).key(),
            "pool": p["pool"],
            "items": p["items"],
            "seed": seed,
            "targets": sorted(pool_targets(p)),
        },
        sort_keys=True,
    )
    return (
        Path(p["cache"])
        / "pools"
        / f"{task_label(task, hops)}-{hashlib.sha1(raw.encode()).hexdigest()[:12]}.safetensors"
    )


def pool_targets(p: dict) -> list[str]:
    return sorted({target_key(t, p) for t in [*p["targets"], *p["independent_targets"]]})


def build_pool(teacher, p: dict, task: str, hops: int, seed: int) -> tuple[EvidenceBatch, dict[str, torch.Tensor]]:
    """``pool`` fresh training examples and every training target for them, computed once."""
    gym = gym_of(teacher_config(p, task, hops, seed))
    N = p["items"]
    pool = gym.sample(p["pool"], (max(gym.min_items, N // 2), N), np.random.default_rng([seed, 2024]))
    targets = {}
    for t in [*p["targets"], *p["independent_targets"]]:
        key = target_key(t, p)
        if key in targets:
            continue
        name, k = target_spec(t, p)
        parts = []
        for s in range(0, len(pool), 2048):
            b = pool.select(slice(s, s + 2048))
            parts.append(target_masks(teacher, b, name, k=None if k == "gold" else budget_k(parse_budget(k), b.valid)))
        targets[key] = torch.cat(parts)
    return pool, targets


def save_pool(path: Path, pool: EvidenceBatch, targets: dict[str, torch.Tensor]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f: getattr(pool, f).contiguous() for f in POOL_FIELDS}
    tensors.update({f"target:{k}": v.contiguous() for k, v in targets.items()})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata={"task": pool.task})
    os.replace(tmp, path)


def load_pool(path: Path) -> tuple[EvidenceBatch, dict[str, torch.Tensor]]:
    if not path.exists():
        raise MasklabError(f"training pool {path} is missing; run the study's prepare step (it runs first)")
    with safe_open(str(path), "pt") as f:
        task = f.metadata()["task"]
        t = {k: f.get_tensor(k) for k in f.keys()}
    pool = EvidenceBatch(task, *(t[f] for f in POOL_FIELDS))
    return pool, {k.split(":", 1)[1]: v for k, v in t.items() if k.startswith("target:")}


def prepare_one(spec: dict, ckpt_dir: Path) -> dict:
    """The seed's teacher (cached) and the seed's training pool for one gym."""
    p = spec["params"]
    task, hops, seed = p["gym"], p["hops"], spec["seed"]
    tcfg = teacher_config(p, task, hops, seed)
    t0 = time.perf_counter()
    teacher, info = load_or_train(tcfg, Path(p["cache"]), ckpt_dir)
    teacher_seconds = time.perf_counter() - t0
    path = pool_path(p, task, hops, seed)
    t1 = time.perf_counter()
    if not path.exists():
        save_pool(path, *build_pool(teacher, p, task, hops, seed))
    metrics = {
        "teacher_acc_n": info["acc_n"],
        "teacher_acc_max": info["acc_max"],
        "teacher_cached": float(info["cached"]),
        "teacher_seconds": round(teacher_seconds, 2),
        "pool_seconds": round(time.perf_counter() - t1, 2),
    }
    return {
        "metrics": metrics,
        "curves": info["curves"],
        "extra": {"teacher_key": tcfg.key(), "teacher_seed": tcfg.seed},
    }


# ----------------------------------------------------------------------------- evaluation


def eval_batches(p: dict, task: str, hops: int, seed: int) -> dict[int, EvidenceBatch]:
    gym = gym_of(teacher_config(p, task, hops, seed))
    return {m: gym.sample(p["examples"], m * p["items"], np.random.default_rng([seed, 999, m])) for m in p["lengths"]}


def evaluate_scores(
    teacher, batch: EvidenceBatch, scores: torch.Tensor, p: dict, m: int, keep_all: bool = False
) -> dict[str, float]:
    """Accuracy and gold recall of the teacher reading the kept items, for every budget."""
    out = {}
    budgets = [p["budget"], *dict.fromkeys([*p["fractions"], *p["budgets"]])]
    for i, b in enumerate(budgets):
        keep = batch.valid.clone() if keep_all else keep_mask(scores, batch.valid, parse_budget(b), gold=batch.gold)
        acc = float((teacher_answer(teacher, batch, keep, p["mode"]) == batch.answer).float().mean())
        recall = float(((keep & batch.gold).sum(1).float() / batch.gold.sum(1).clamp(min=1).float()).mean())
        suffix = "" if i == 0 else f"@{budget_label(parse_budget(b))}"
        out[f"acc_{m}x{suffix}"] = acc
        out[f"recall_{m}x{suffix}"] = recall
        if i == 0:
            out[f"kept_{m}x"] = float(keep.sum(1).float().mean())
    return out


def timed(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def router_cost(teacher, router, batch: EvidenceBatch, scores: torch.Tensor, p: dict, m: int) -> dict[str, float]:
    """FLOPs ratio by formula (``scores``: the router's scores on ``batch``, for the kept count)
    and measured wall-clock speed-up of router + sparse teacher."""
    budget = parse_budget(p["budget"])
    n = int(batch.items.shape[1])

    def sparse():
        s = router_scores(router, batch)  # on the CPU: the time includes moving to and from the device
        keep = keep_mask(s, batch.valid, budget, gold=batch.gold)
        answer_logits(teacher, batch, keep, "delete")

    def dense():
        answer_logits(teacher, batch)

    k = float(keep_mask(scores, batch.valid, budget, gold=batch.gold).sum(1).float().mean())
    flops = (router.flops(n) + teacher_flops(teacher, round(k))) / teacher_flops(teacher, n)
    return {f"flops_ratio_{m}x": flops, f"speedup_{m}x": timed(dense) / timed(sparse)}


def load_teacher_for(p: dict, task: str, hops: int, seed: int):
    teacher, _ = load_or_train(teacher_config(p, task, hops, seed), Path(p["cache"]))  # cached by prepare
    return teacher


def router_one(spec: dict, ckpt_dir: Path) -> dict:
    """Train one router on one target of the (gym, seed) pool and evaluate it."""
    p = spec["params"]
    task, hops, seed = p["gym"], p["hops"], spec["seed"]
    teacher = load_teacher_for(p, task, hops, seed)
    pool, targets = load_pool(pool_path(p, task, hops, seed))
    target = target_key(p["target"], p)
    torch.manual_seed(seed)
    router = build_router(
        p["router"], p["vocab"], p["router_dim"], p["router_depth"], p["router_heads"], p["length_scale"]
    )
    info = train_router(
        router,
        pool,
        targets[target],
        items=p["items"],
        steps=p["router_steps"],
        batch=p["router_batch"],
        lr=p["router_lr"],
        loss=p["loss"],
        seed=seed,
        ckpt_dir=ckpt_dir,
    )
    metrics: dict[str, float] = {"target_fit": info["curves"]["recall"][-1], "train_seconds": info["seconds"]}
    for m, batch in eval_batches(p, task, hops, seed).items():
        scores = router_scores(router, batch)
        metrics.update(evaluate_scores(teacher, batch, scores, p, m))
        metrics.update(router_cost(teacher, router, batch, scores, p, m))
    params = sum(x.numel() for x in router.parameters())
    extra = {"router_parameters": params, "teacher_parameters": sum(x.numel() for x in teacher.parameters())}
    return {"metrics": metrics, "curves": info["curves"], "extra": extra}


def baselines_one(spec: dict, ckpt_dir: Path) -> dict:
    """Every baseline selection at every length and budget (``name|metric`` keys)."""
    p = spec["params"]
    task, hops, seed = p["gym"], p["hops"], spec["seed"]
    teacher = load_teacher_for(p, task, hops, seed)
    rng = np.random.default_rng([seed, 555])
    metrics: dict[str, float] = {}
    for m, batch in eval_batches(p, task, hops, seed).items():
        for name in p["baselines"]:
            sel = SELECTORS[name]
            if name == "teacher-attention":
                sel = AttentionSelector(p["snap_aggregate"])
            scores = sel.score(teacher, batch, rng)
            res = evaluate_scores(teacher, batch, scores, p, m, keep_all=name == "dense")
            metrics.update({f"{name}|{k}": v for k, v in res.items()})
    return {"metrics": metrics, "curves": {}, "extra": {}}


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    return {"prepare": prepare_one, "router": router_one, "baselines": baselines_one}[spec["params"]["kind"]](
        spec, ckpt_dir
    )


# ----------------------------------------------------------------------------- study


def gym_runs(cfg: Config) -> list[tuple[str, int]]:
    return [(t, h) for t in cfg.tasks for h in (cfg.hops if t == "multihop" else [0])]


def gym_params(cfg: Config, task: str, hops: int) -> dict:
    """Run parameters shared by every run of one gym, with its teacher recipe resolved."""
    base = {
        k: v for k, v in asdict(cfg).items() if k not in ("tasks", "hops", "seeds", "teacher_steps", "min_teacher_acc")
    }
    return {**base, **evidence.teacher_recipe(task, hops, cfg.teacher_steps), "gym": task, "hops": hops}


def prepare_specs(cfg: Config) -> list[RunSpec]:
    """One per gym x seed: the seed's teacher and pool (a shared teacher is trained once, then read from the cache)."""
    return [
        RunSpec(task_label(t, h), "prepare", s, {**gym_params(cfg, t, h), "kind": "prepare"})
        for t, h in gym_runs(cfg)
        for s in cfg.seeds
    ]


def router_specs(cfg: Config) -> list[RunSpec]:
    specs = []
    for t, h in gym_runs(cfg):
        gym = gym_params(cfg, t, h)
        for seed in cfg.seeds:
            for router, targets in (("transformer", cfg.targets), ("independent", cfg.independent_targets)):
                for target in targets:
                    label = f"router/{target}" if router == "transformer" else f"{router}/{target}"
                    specs.append(
                        RunSpec(
                            task_label(t, h), label, seed, {**gym, "kind": "router", "router": router, "target": target}
                        )
                    )
            if cfg.baselines:
                specs.append(RunSpec(task_label(t, h), "baselines", seed, {**gym, "kind": "baselines"}))
    return specs


def validate(cfg: Config) -> None:
    check_choices("task", cfg.tasks, GYMS)
    names = set(target_names())
    for t in [*cfg.targets, *cfg.independent_targets]:
        if resolve_target(t) not in names and not re.fullmatch(r"layer\d+(/topk|/top10pct)?", t):
            raise MasklabError(
                f"unknown router target {t!r}; "
                f"choose from causal, attention, attention-gold-k, {', '.join(sorted(names))}"
            )
    parse_budget(cfg.attention_k)
    if not 0 <= cfg.min_teacher_acc <= 1:
        raise MasklabError(f"--min-teacher-acc must be in [0, 1]; got {cfg.min_teacher_acc}")
    for f in cfg.fractions:
        if not isinstance(parse_budget(f), float):
            raise MasklabError(f"--fractions takes fractions of the context (10% or 0.1); got {f!r}")
    aggregate_fn(cfg.snap_aggregate)
    check_choices("baseline", cfg.baselines, BASELINES)
    for b in [cfg.budget, *cfg.budgets]:
        parse_budget(b)
    check_choices("--loss", [cfg.loss], LOSSES)
    if max(cfg.lengths) > cfg.max_factor or min(cfg.lengths) < 1:
        raise MasklabError(f"--lengths must be in 1..{cfg.max_factor} (the teacher reads up to max_factor x N)")
    if cfg.items < 2 or cfg.pool < cfg.router_batch or cfg.examples < 1 or cfg.router_steps < 1:
        raise MasklabError("--items must be >= 2, --pool >= the router batch, --examples and --router-steps positive")
    for t, h in gym_runs(cfg):
        gym_of(teacher_config(gym_params(cfg, t, h), t, h, cfg.teacher_seed)).check(cfg.items * cfg.max_factor)


def expand(runs: list[dict]) -> list[dict]:
    """Baseline runs hold ``name|metric`` keys: one pseudo-run per baseline."""
    out = []
    for r in runs:
        if r["method"] != "baselines":
            out.append(r)
            continue
        per: dict[str, dict] = {}
        for key, v in r["metrics"].items():
            name, metric = key.split("|", 1)
            per.setdefault(name, {})[metric] = v
        out += [
            {"task": r["task"], "method": name, "seed": r["seed"], "metrics": ms, "curves": {}}
            for name, ms in per.items()
        ]
    return out


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab route") -> dict:
    validate(cfg)
    out = Path(out)
    prep = run_study(
        f"{NAME}-prepare",
        asdict(cfg),
        prepare_specs(cfg),
        "masklab.lab.studies.routing:run_one",
        out / "prepare",
        jobs=jobs,
        progress=progress,
    )
    results = run_study(
        NAME,
        asdict(cfg),
        router_specs(cfg),
        "masklab.lab.studies.routing:run_one",
        out,
        jobs=jobs,
        paper=PAPER,
        progress=progress,
    )
    results["summary"] = summarize(expand(results["runs"]))
    results["teachers"] = prep["summary"]
    results["untrained_teachers"] = untrained_teachers(prep["runs"], cfg.min_teacher_acc)
    bad = {(f["task"], f["seed"]) for f in results["untrained_teachers"]}
    for r in results["runs"]:  # every row of a (gym, seed) rests on that seed's teacher
        r.setdefault("extra", {})["teacher_untrained"] = (r["task"], r["seed"]) in bad
    warn_untrained(results["untrained_teachers"], cfg.min_teacher_acc, NAME)
    write_json(out / "results.json", results)
    report(results, cfg, out, command)
    return results


# ----------------------------------------------------------------------------- report


def plot_budget_curves(summary: list[dict], cfg: Config, path: Path) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    tasks = list(dict.fromkeys(r["task"] for r in summary))
    lengths = [min(cfg.lengths), max(cfg.lengths)] if len(cfg.lengths) > 1 else cfg.lengths
    counts = [b for b in cfg.budgets if isinstance(parse_budget(b), int)]
    fig, axes = plt.subplots(
        len(lengths), len(tasks), figsize=(4.0 * len(tasks) + 2.0, 3.3 * len(lengths) + 0.5), squeeze=False
    )
    for i, m in enumerate(lengths):
        for ax, task in zip(axes[i], tasks):
            for r in (r for r in summary if r["task"] == task):
                ys = [r.get(f"acc_{m}x@{b}_mean") for b in counts]
                es = [r.get(f"acc_{m}x@{b}_std") or 0.0 for b in counts]
                if any(y is None for y in ys):
                    continue
                style = "-" if r["method"].startswith(("router", "independent")) else "--"
                ax.errorbar(
                    [int(b) for b in counts],
                    ys,
                    yerr=es,
                    label=r["method"],
                    linestyle=style,
                    marker="o",
                    ms=3,
                    capsize=2,
                )
            ax.set_title(f"{task}, {m} x N = {m * cfg.items} items", fontsize=10)
            ax.set_xlabel("items kept (k)")
            ax.set_ylabel("teacher accuracy")
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.suptitle("Teacher accuracy reading only the kept items, vs budget")
    save_figure(fig, path, rect=(0, 0, 1 - 2.0 / fig.get_figwidth(), 1))


NOTES = """\
Rows: `router/<target>` a transformer router trained on that target (`causal` = leave-one-out evidence of the
teacher's dense answer, `attention` = the teacher's last-layer top-k attention items with k = `--attention-k` of each
context, `attention-gold-k` = the same with k = the gold evidence size, `gold` = the gym's exact evidence); \
`independent/<target>` a router whose items do not see each other; baselines `dense`
(teacher reads everything), `random`, `recent` (the last k items), `teacher-attention` (SnapKV-style: the items the
teacher attends to most in a dense pre-fill), `oracle-gold`. `acc_<m>x`: the teacher's accuracy reading only the
kept items at m x N items; `recall_<m>x`: fraction of gold evidence kept; routers are trained at N only.
`flops_ratio_4x`: (router + sparse teacher) / dense teacher FLOPs by formula; `speedup_4x`: measured wall-clock
dense / (router + sparse teacher) on the evaluation batch (one process, one thread)."""


def report(results: dict, cfg: Config, out: Path, command: str) -> None:
    summary = results["summary"]
    m_hi = max(cfg.lengths)
    main = ["acc_1x", "recall_1x", *(f"acc_{m}x" for m in cfg.lengths if m > 1), f"recall_{m_hi}x", "kept_1x"]
    cost = ["param_ratio", f"flops_ratio_{m_hi}x", f"speedup_{m_hi}x", "target_fit", "train_seconds"]
    paper = [{**p, "metric": "acc"} for p in results["paper"]]
    plot_budget_curves(summary, cfg, out / "routing_budget.png")
    routers = [dict(r) for r in summary if r["method"].startswith(("router", "independent"))]
    for r in routers:  # parameters of the router relative to the teacher's
        ratios = [
            x["extra"]["router_parameters"] / x["extra"]["teacher_parameters"]
            for x in results["runs"]
            if (x["task"], x["method"]) == (r["task"], r["method"])
        ]
        add_stats(r, "param_ratio", ratios)
    teachers = markdown_table(
        results["teachers"], [], ["teacher_acc_n", "teacher_acc_max", "teacher_seconds", "pool_seconds"]
    )
    note = untrained_note(results.get("untrained_teachers", []), cfg.min_teacher_acc)
    parts = [
        "# routing",
        "",
        f"Regenerate with: `{command}`",
        "",
        *([note, ""] if note else []),
        f"## Teacher accuracy from the kept items (budget `{cfg.budget}`; N = {cfg.items})",
        "",
        markdown_table(summary, paper, main),
        "",
    ]
    for f in cfg.fractions:  # headline budgets that need no gold size
        label = budget_label(parse_budget(f))
        cols = [*(f"acc_{m}x@{label}" for m in cfg.lengths), f"recall_{m_hi}x@{label}"]
        parts += [
            f"## Teacher accuracy from the kept items (budget {f} of each context; N = {cfg.items})",
            "",
            markdown_table(summary, [], cols),
            "",
        ]
    parts += [
        NOTES,
        "",
        "## Cost and fit of the routers",
        "",
        markdown_table(routers, [], cost),
        "",
    ]
    parts += [
        "## Teachers and training pools (one prepare run per seed)",
        "",
        teachers,
        "",
        "![routing_budget.png](routing_budget.png)",
        "",
        environment_line(results),
    ]
    atomic_write_text(out / "results.md", "\n".join(parts) + "\n")
