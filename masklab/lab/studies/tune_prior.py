"""Tune attention priors alone on a frozen pretrained LM to fix stale answers (vs LoRA).

Every attention layer gets a :class:`~masklab.priors.bias.RelativePrior` (per head, per relative
distance bucket) through :func:`masklab.pretrained.hf.attach_priors`; the model itself is frozen. The
priors are trained with teacher forcing on the *current* value of generated stale-fact
prompts (:mod:`masklab.lab.tasks.stale_prompts`, in the model's prompt format) and evaluated
by greedy decoding on held-out prompts (see :data:`NOTES` for what is disjoint).

Methods (``--method``): ``base`` (no training), ``prior`` (``RelativePrior`` only),
``recency`` (:class:`~masklab.priors.bias.RecencyPrior` only: one slope per head over
``log(1 + distance)``) and ``lora`` (PEFT LoRA on the attention projections, rank ``--lora-rank``
on ``--lora-targets``, in as many evenly spaced layers as bring its trainable parameters closest
to the prior's; same prompts, same steps, same order). Reported per model and method: held-out ``accuracy``,
``stale_rate``, ``other_rate``, ``empty_rate`` (all over every held-out prompt),
``trainable`` parameters, ``ppl_change`` (pydoc perplexity after / before - 1) and wall
time. One run per (model, method, seed); each run loads its model afresh.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from masklab.util import device as devices
from masklab.util.errors import MasklabError
from masklab.util.flags import flag
from masklab.lab.report import write_markdown
from masklab.lab.runner import RunSpec, run_study
from masklab.lab.studies.stale import min_max

NAME = "tune-prior"
# run_one loads its model on the run's device; the priors (attach_priors) and LoRA's adapters (PEFT)
# are made beside the layers they adapt, and every token tensor is built on the CPU, then moved
DEVICES = ("cpu", "cuda")
METHODS = ("base", "prior", "recency", "lora")
TASKS = ("stale",)
TRAIN_ATTRIBUTES = ("city", "colour", "job")
TEST_ATTRIBUTES = ("pet", "number")
TABLE_METRICS = [
    "accuracy",
    "stale_rate",
    "other_rate",
    "empty_rate",
    "trainable",
    "ppl_change",
    "loss_first",
    "loss_last",
    "train_seconds",
    "wall_seconds",
]


@dataclass
class Config:
    models: list[str] = flag(
        factory=lambda: ["smollm2-135m", "gemma3-270m"], name="--model", help="comma-separated models"
    )
    task: str = flag("stale", choices=list(TASKS), help="training and evaluation prompts")
    methods: list[str] = flag(
        factory=lambda: list(METHODS),
        name="--method",
        help="comma-separated methods: base (no training), prior (RelativePrior only), recency (RecencyPrior: "
        "one slope per head), lora (PEFT LoRA)",
    )
    train_prompts: int = flag(400, min=1, help="generated training prompts")
    test_prompts: int = flag(100, min=1, help="generated held-out prompts")
    steps: int = flag(200, min=1, help="training steps (one prompt each, same order for every method)")
    lr: float = flag(0.05, above=0, help="Adam learning rate of the priors")
    lora_lr: float = flag(1e-3, above=0, help="Adam learning rate of the LoRA adapters")
    lora_rank: int = flag(1, min=1, help="LoRA rank")
    lora_targets: list[str] = flag(
        factory=lambda: ["q_proj", "v_proj"], help="comma-separated attention projections LoRA adapts"
    )
    lora_layers: int = flag(
        0,
        min=0,
        help="layers with LoRA adapters, evenly spaced; 0: as many as bring LoRA's trainable "
        "parameters closest to the prior's",
    )
    train_filler: tuple[int, int] = flag(
        (0, 2),
        parse=min_max("train-filler", 0),
        metavar="MIN,MAX",
        help="min,max distractor sentences per gap in training prompts",
    )
    test_filler: tuple[int, int] = flag(
        (3, 4),
        parse=min_max("test-filler", 0),
        metavar="MIN,MAX",
        help="min,max distractor sentences per gap in held-out prompts",
    )
    updates: tuple[int, int] = flag(
        (1, 2), parse=min_max("updates", 1), metavar="MIN,MAX", help="min,max number of updates"
    )
    max_distance: int = flag(512, min=1, help="RelativePrior: distances from here on share the last bucket")
    exact: int = flag(16, min=1, help="RelativePrior: distances with a bucket each")
    log_buckets: int = flag(16, min=0, help="RelativePrior: log-spaced buckets up to --max-distance")
    init: float = 0.0  # theta at start: logsigmoid(0) everywhere = a constant shift, outputs unchanged
    ppl_tokens: int = flag(512, min=2, help="tokens of pydoc text for the perplexity")
    max_new_tokens: int = flag(5, min=1, help="tokens generated per held-out answer")
    prompt_format: str | None = flag(
        None,
        choices=["raw", "chat"],
        default_text="each model's own, see `masklab models`",
        help="raw completion or the model's chat turns",
    )
    threads: int = flag(1, min=1, help="torch threads per run")
    seeds: list[int] = field(default_factory=lambda: [0])


def quick_config() -> Config:
    """About five minutes on SmolLM2 (the four methods, one thread each; 297 s measured on a busy 2-core CPU):
    40 training steps, 20 held-out prompts."""
    return Config(models=["smollm2-135m"], train_prompts=40, test_prompts=20, steps=40, ppl_tokens=256)


def reproduce_config() -> Config:
    """Both models, every method: 100 steps, 50 held-out prompts, 256 pydoc tokens. Sized
    from the quick runs' timings on this CPU under load (about 5 s per training step and
    8 s per held-out prompt with a prior attached): about 100 minutes of run time in all,
    about 50 minutes of wall time with the default ``--jobs 2`` (docs/pretrained.md)."""
    return Config(train_prompts=200, test_prompts=50, steps=100, ppl_tokens=256)


# --------------------------------------------------------------------------- data
def split_prompts(n: int, seed: int, train: bool, cfg: Config) -> list:
    """Prompts of the train or the held-out split: disjoint entity names, attributes
    (value types and wordings) and distractor distances."""
    from masklab.lab.tasks.stale_prompts import NAMES, make_prompt

    names = set(NAMES[: len(NAMES) // 2]) if train else set(NAMES[len(NAMES) // 2 :])
    attrs = TRAIN_ATTRIBUTES if train else TEST_ATTRIBUTES
    filler = tuple(cfg.train_filler if train else cfg.test_filler)
    rng = random.Random(seed * 2 + (0 if train else 1))
    out = []
    while len(out) < n:
        p = make_prompt(rng, updates=tuple(cfg.updates), filler=filler, attribute=rng.choice(attrs))
        if p.entity in names:  # rejection keeps make_prompt's own sampling of everything else
            out.append(p)
    return out


def answer_batch(lm, p) -> tuple[torch.Tensor, int]:
    """``(ids (1, T + A), T)``: the prompt in ``lm``'s format (``T`` tokens, as the held-out
    evaluation feeds it) followed by the tokens of ``" " + current value``."""
    from masklab.pretrained.lm import encode

    prompt = encode(lm, p.sentences, p.query).ids
    answer = lm.tokenizer(" " + p.current, add_special_tokens=False, return_tensors="pt").input_ids[0]
    return torch.cat([prompt, answer])[None], prompt.numel()


def answer_loss(model: torch.nn.Module, ids: torch.Tensor, T: int) -> torch.Tensor:
    """Cross-entropy of the answer tokens ``ids[0, T:]`` given everything before them; ``ids``
    ``(1, T + A)`` go to the model's device."""
    ids = ids.to(devices.of(model))
    # only the positions that predict answer tokens go through the LM head (Gemma 3's
    # 262k-token head otherwise costs as much as the rest of the model)
    logits = model(ids, logits_to_keep=ids.shape[1] - T + 1).logits[0, :-1]  # predicts tokens T .. end
    return torch.nn.functional.cross_entropy(logits.float(), ids[0, T:])


# --------------------------------------------------------------------------- methods
def lora_layer_count(per_layer: int, layers: int, target: int) -> int:
    """How many layers of ``per_layer`` LoRA parameters come closest to ``target`` (at least one)."""
    return min(layers, max(1, round(target / per_layer)))


def prior_factory(method: str, cfg: Config):
    from masklab.priors.bias import RecencyPrior, RelativePrior

    if method == "recency":
        return lambda layer, heads: RecencyPrior(heads)
    return lambda layer, heads: RelativePrior(heads, cfg.max_distance, cfg.exact, cfg.log_buckets, allowed=cfg.init)


def prior_parameter_count(model: torch.nn.Module, cfg: Config) -> int:
    from masklab.pretrained.hf import attention_layers

    return len(attention_layers(model)) * int(model.config.num_attention_heads) * (cfg.exact + cfg.log_buckets)


def add_lora(model: torch.nn.Module, cfg: Config, seed: int = 0) -> tuple[torch.nn.Module, list[int]]:
    """Wrap ``model`` with PEFT LoRA adapters (base weights frozen), their random start drawn
    from ``seed``; returns the PEFT model and the layers that got adapters."""
    from peft import LoraConfig, get_peft_model

    from masklab.pretrained.hf import attention_layers

    attn = attention_layers(model)
    mods = [getattr(attn[0], t, None) for t in cfg.lora_targets]
    if not all(isinstance(m, torch.nn.Linear) for m in mods):
        raise MasklabError(
            f"--lora-targets: this model's attention has no linear {cfg.lora_targets}; "
            "use names such as q_proj,k_proj,v_proj,o_proj"
        )
    per_layer = sum(cfg.lora_rank * (m.in_features + m.out_features) for m in mods)
    n = cfg.lora_layers or lora_layer_count(per_layer, len(attn), prior_parameter_count(model, cfg))
    n = min(n, len(attn))
    layers = sorted({round(i * (len(attn) - 1) / max(n - 1, 1)) for i in range(n)}) if n > 1 else [len(attn) // 2]
    lc = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_rank,
        lora_dropout=0.0,
        target_modules=list(cfg.lora_targets),
        layers_to_transform=layers,
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):  # PEFT draws the adapters' start from the global generator
        torch.manual_seed(seed)
        return get_peft_model(model, lc), layers


CKPT_EVERY = 25  # training steps between checkpoints of the tuned parameters


class _Tuned(torch.nn.Module):
    """The trained parameters alone (the same tensors as the model's), so a checkpoint holds
    the priors or adapters and their Adam state, not the frozen model."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__()
        self.params = torch.nn.ParameterList(params)


def adapt(
    model: torch.nn.Module,
    method: str,
    cfg: Config,
    batches: list[tuple[torch.Tensor, int]],
    seed: int,
    log=None,
    ckpt_dir: Path | None = None,
    every: int = CKPT_EVERY,
) -> tuple[torch.nn.Module, dict]:
    """Train ``method``'s parameters on ``cfg.steps`` batches drawn (seeded) from ``batches``.

    Returns the model to evaluate (the PEFT wrapper for ``lora``) and a record: trainable
    parameter count, the names of the trained parameters, loss at the start / end, seconds.
    With ``ckpt_dir``, the trained parameters, Adam's state, the prompt order and the losses
    so far are saved there every ``every`` steps and after the last (:class:`~masklab.lab.runner.Checkpoint`),
    and a later call continues from them with the same numbers as an uninterrupted run.
    """
    from masklab.lab.runner import Checkpoint

    if method not in METHODS:
        raise MasklabError(f"unknown method {method!r}: use {', '.join(METHODS)}")
    model.requires_grad_(False)
    info: dict = {"trainable": 0, "trained": [], "lora_layers": []}
    if method == "base":
        return model, info
    if method in ("prior", "recency"):
        from masklab.pretrained.hf import attach_priors

        attach_priors(model, prior_factory(method, cfg))
        lr = cfg.lr
    else:
        model, info["lora_layers"] = add_lora(model, cfg, seed)
        lr = cfg.lora_lr
    key = "lora_" if method == "lora" else "prior"
    named = [(n, p) for n, p in model.named_parameters() if key in n]
    for _, p in named:
        p.requires_grad_(True)
    params = [p for _, p in named]
    info["trainable"] = sum(p.numel() for p in params)
    info["trained"] = [n for n, _ in named]
    opt = torch.optim.Adam(params, lr=lr)
    rng = random.Random(seed)
    losses: list[float] = []
    tuned, gen = _Tuned(params), torch.Generator()  # gen: Checkpoint's slot; the order is drawn by rng
    ckpt = Checkpoint(Path(ckpt_dir) / f"tune-{method}") if ckpt_dir is not None else None
    start = 0
    if ckpt is not None and ckpt.exists:
        start, extra = ckpt.load(tuned, opt, gen)
        if extra.get("trained") != info["trained"]:
            raise MasklabError(f"the checkpoint in {ckpt.dir} trained other parameters; delete it to start over")
        losses = list(extra["losses"])
        version, state, gauss = extra["rng"]
        rng.setstate((version, tuple(state), gauss))
        if log:
            log(f"{method}: continuing from the checkpoint at step {start}/{cfg.steps}")
    t0 = time.perf_counter()
    for step in range(start, cfg.steps):
        ids, T = batches[rng.randrange(len(batches))]
        loss = answer_loss(model, ids, T)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log and (step + 1) % 25 == 0:
            log(
                f"{method} step {step + 1}/{cfg.steps} loss {sum(losses[-25:]) / 25:.3f} "
                f"{time.perf_counter() - t0:.0f}s"
            )
        if ckpt is not None and ((step + 1) % every == 0 or step + 1 == cfg.steps):
            ckpt.save(
                step + 1, tuned, opt, gen, {"losses": losses, "rng": list(rng.getstate()), "trained": info["trained"]}
            )
    model.eval()
    k = max(1, len(losses) // 5)
    if losses:
        info["loss_first"], info["loss_last"] = sum(losses[:k]) / k, sum(losses[-k:]) / k
    return model, info


# --------------------------------------------------------------------------- evaluation
EVAL_EVERY = 5  # held-out answers between saves of the answers so far


@torch.no_grad()
def evaluate(lm, prompts: list, max_new_tokens: int, ckpt: Path | None = None) -> tuple[dict, list[dict]]:
    """Answer classes over every held-out prompt (an empty answer counts as not current).

    With ``ckpt`` (a JSON file), the answers so far are saved every :data:`EVAL_EVERY`
    prompts and a later call with the same prompts continues after them (greedy decoding:
    the same answers as one uninterrupted pass)."""
    from masklab.util.files import read_json, write_json
    from masklab.pretrained.lm import encode, generate
    from masklab.lab.tasks.stale_prompts import score_answer

    recs: list[dict] = []
    asked = [p.prompt for p in prompts]
    if ckpt is not None and Path(ckpt).exists():
        saved = read_json(Path(ckpt))
        if saved.get("prompts") == asked:
            recs = saved["recs"]
    for i in range(len(recs), len(prompts)):
        p = prompts[i]
        _, text = generate(lm, encode(lm, p.sentences, p.query).ids, max_new_tokens)
        recs.append({"answer": text, "class": score_answer(text, p), "values": p.values})
        if ckpt is not None and (len(recs) % EVAL_EVERY == 0 and len(recs) < len(prompts)):
            write_json(Path(ckpt), {"prompts": asked, "recs": recs})
    n = len(prompts)
    count = lambda c: sum(r["class"] == c for r in recs) / n  # noqa: E731
    return {
        "accuracy": count("current"),
        "stale_rate": count("stale"),
        "other_rate": count("other"),
        "empty_rate": count("empty"),
    }, recs


@torch.no_grad()
def pydoc_perplexity(model: torch.nn.Module, tokenizer, tokens: int) -> float:
    """Perplexity on the first ``tokens`` tokens of two fixed pydoc topics (plain text, not
    in the prompt format; single sentences of it may also appear as prompt distractors)."""
    from pydoc_data.topics import topics

    text = topics[sorted(topics)[len(topics) // 2]] + " " + topics[sorted(topics)[-1]]
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :tokens].to(devices.of(model))
    logits = model(ids).logits[0, :-1].float()
    return math.exp(torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item())


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    from masklab.pretrained.models import load

    p, method = spec["params"], spec["method"]
    cfg = Config(**{k: v for k, v in p.items() if k not in ("model",)}, models=[p["model"]])
    t0 = time.perf_counter()
    lm = load(p["model"], threads=p["threads"], prompt_format=p.get("prompt_format"), device=devices.current())
    n_params = sum(q.numel() for q in lm.model.parameters())
    train = split_prompts(cfg.train_prompts, spec["seed"], True, cfg)
    test = split_prompts(cfg.test_prompts, spec["seed"], False, cfg)
    ppl_before = pydoc_perplexity(lm.model, lm.tokenizer, cfg.ppl_tokens)
    t_train = time.perf_counter()
    batches = [answer_batch(lm, q) for q in train]
    lm.model, info = adapt(
        lm.model,
        method,
        cfg,
        batches,
        spec["seed"],
        log=lambda s: print(s, file=sys.stderr, flush=True),
        ckpt_dir=ckpt_dir,
    )
    train_s = time.perf_counter() - t_train
    if method in ("prior", "recency"):
        from masklab.pretrained.hf import save_priors

        save_priors(lm.model, Path(ckpt_dir) / "priors.safetensors")
    metrics, recs = evaluate(lm, test, cfg.max_new_tokens, ckpt=Path(ckpt_dir) / f"eval-{method}.json")
    ppl = pydoc_perplexity(lm.model, lm.tokenizer, cfg.ppl_tokens)
    metrics.update(
        {
            "trainable": info["trainable"],
            "trainable_frac": info["trainable"] / n_params,
            "ppl": ppl,
            "ppl_base": ppl_before,
            "ppl_change": ppl / ppl_before - 1,
            "train_seconds": train_s,
            "wall_seconds": time.perf_counter() - t0,
            "model_parameters": n_params,
            "mean_train_tokens": sum(ids.shape[1] for ids, _ in batches) / max(len(batches), 1),
            **{k: info[k] for k in ("loss_first", "loss_last") if k in info},
        }
    )
    extra = {
        "prompt_format": lm.prompt_format,
        "lora_layers": info["lora_layers"],
        "trained_parameters": len(info["trained"]),
        "examples": [{"prompt": q.prompt, **r} for q, r in list(zip(test, recs))[:3]],
    }
    from masklab.lab.runner import Checkpoint

    Checkpoint(Path(ckpt_dir) / f"tune-{method}").clear()  # the run is done: its record holds everything
    (Path(ckpt_dir) / f"eval-{method}.json").unlink(missing_ok=True)
    return {"metrics": metrics, "curves": {}, "extra": extra}


# --------------------------------------------------------------------------- study
def run_spec(model: str, method: str, seed: int, params: dict) -> RunSpec:
    """One run of ``params["task"]`` on ``model`` (:attr:`RunSpec.model`, also ``params["model"]``)."""
    return RunSpec(params["task"], method, seed, {**params, "model": model}, model=model)


def specs_for(cfg: Config) -> list[RunSpec]:
    params = json.loads(json.dumps({k: v for k, v in asdict(cfg).items() if k not in ("models", "methods", "seeds")}))
    return [run_spec(m, meth, s, params) for m in cfg.models for meth in cfg.methods for s in cfg.seeds]


NOTES = """\
Rows: task x model x method. `accuracy` / `stale_rate` / `other_rate` / `empty_rate`
are answer classes over every held-out prompt (greedy, exact match of the first word(s));
`trainable` counts trained parameters (`trainable_frac` of the model's); `ppl_change` is
pydoc perplexity after training / before - 1 (plain text, not stale prompts);
`loss_first`/`loss_last` are the mean training loss over the first/last fifth of the steps.

Held-out split (what is disjoint from training): entity names (the two halves of the name
list), value types (train: city, colour, job; held out: pet, number), hence also the
wordings of statements, updates and questions (each attribute has its own templates),
and distances: distractor sentences per gap (`--train-filler` vs `--test-filler`, by
default 0-2 vs 3-4). Shared: the distractor pool, the prompt format and the number of
updates.

What a relative-distance prior can express: one bias per (layer, head, distance bucket),
the same for every prompt. It cannot know where the current fact is; it can only make a
head prefer some distances over others. Trained at distances 0-2 sentences per gap it
learns where the current value sits in training prompts, and at held-out distances the
same bias points at the wrong place. A prior can generalise across distances only as far
as "prefer nearer (or farther) tokens" helps: the current value is always the latest
mention of the attribute, but the distractor sentences after it are nearer still, and a
content-independent bias cannot tell them apart. `recency` is that monotone design (one
slope per layer and head over log distance: it can rank nearer vs farther, it cannot
single out a distance), measured beside `prior` to see whether the ranking transfers.
LoRA adapts the projections (content-dependent) in the listed layers, rank `--lora-rank`.
"""


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")  # the attention projections of every packaged model


def validate(cfg: Config) -> None:
    """Every check of the options that needs no model, before any run starts (the CLI's
    validation step calls it; :func:`run` too): the declared ranges, methods, models,
    prompt format, LoRA targets of the packaged models and the peft package."""
    from masklab.util.flags import check_ranges
    from masklab.text.inputs import check_model_paths
    from masklab.pretrained.models import MODELS, check_models, check_prompt_format

    check_ranges(cfg)
    if not cfg.methods or any(m not in METHODS for m in cfg.methods):
        raise MasklabError(f"--method takes a comma-separated list of {', '.join(METHODS)}")
    if len(set(cfg.methods)) != len(cfg.methods):
        raise MasklabError("--method: a method is listed twice")
    check_models(cfg.models)
    check_model_paths(cfg.models)
    check_prompt_format(cfg.prompt_format)
    if "lora" in cfg.methods:
        from masklab.pretrained.models import require

        bad = [t for t in cfg.lora_targets if t not in LORA_TARGETS]
        if not cfg.lora_targets or (bad and all(m in MODELS for m in cfg.models)):
            raise MasklabError(
                f"--lora-targets: unknown projection(s) {', '.join(bad) or '(none)'}; "
                f"the packaged models' attention has {', '.join(LORA_TARGETS)}"
            )
        require("peft", "pip install peft==0.21.2 (the pretrained extra)")


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab tune-prior") -> dict:
    validate(cfg)
    specs = specs_for(cfg)
    res = run_study(
        NAME,
        asdict(cfg),
        specs,
        "masklab.lab.studies.tune_prior:run_one",
        out,
        jobs=min(jobs, len(specs)),
        threads=cfg.threads,
        progress=progress,
    )
    write_markdown(res, out, TABLE_METRICS, command, NOTES)
    return res
