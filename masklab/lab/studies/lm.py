"""Study A, language table: a causal relative-distance mask prior in a GPT-style LM.

A :class:`~masklab.models.GPT` is trained from scratch on next-token prediction (AdamW,
linear warm-up then cosine decay). Priors (one small module per block, picked by name):

* ``vanilla`` - learned absolute position embeddings, no prior;
* ``alibi`` - no position embeddings; a fixed linear distance bias
  (:class:`~masklab.priors.bias.ALiBi`) carries position;
* ``mask`` - the vanilla model plus a learnable causal relative-distance
  :class:`~masklab.priors.bias.MaskPrior` per block: ``logsigmoid(M)`` with ``M`` initialised from
  ``S[h, i, j] = 2 ** (-(i - j) / w_h)`` (widths ``w_h`` from 1 to the context length,
  :func:`masklab.priors.structures.relative_distance`);
* ``mask-nopos`` - the same prior without position embeddings (position only through the
  prior, as for ALiBi): the control that separates the prior from the extra positions;
* ``mask-zero`` - the ``mask`` model with the same learnable ``(H, T, T)`` MaskPrior but no
  structure (``M = 0`` everywhere, a uniform bias: :meth:`masklab.priors.bias.MaskPrior.uniform`):
  the control that separates the prior's structure from its extra learnable parameters.

Metrics: validation perplexity over training (fixed, evenly spaced validation windows),
the final value, and the number of steps to reach a target perplexity.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from masklab.lab import distributed as dist
from masklab.util.flags import flag
from masklab.models import GPT
from masklab.lab.report import plot_curves, write_markdown
from masklab.util.errors import MasklabError, check_choices
from masklab.lab.runner import RunSpec, run_study, seed_everything
from masklab.priors.structures import relative_distance
from masklab.lab.tasks.text import CORPORA, TOKENIZERS, TokenData, load_corpus, tokenize
from masklab.lab.train import Recipe, priors_for, steps_to, train

NAME = "lm"
DEVICES = ("cpu", "cuda")  # run_one moves its model and data to the run's device (masklab.util.device)
PRECISIONS = (
    "fp32",
    "bf16",
    "fp16",
)  # its training and evaluation run under masklab.util.device.autocast (masklab/lab/train.py)
METHODS = ("vanilla", "alibi", "mask", "mask-nopos", "mask-zero")
DEFAULT_METHODS = ("vanilla", "alibi", "mask")
TABLE_METRICS = ["val_ppl", "best_val_ppl", "steps_to_target", "train_loss", "mask_drift"]

# The paper gives no number we can hold a CPU-scale run to: "modest but consistent gains in
# perplexity and convergence speed" on WikiText-2 and TinyStories (docs/papers.md).
PAPER: list[dict] = []


@dataclass
class Config:
    """Everything an LM run depends on."""

    corpus: str = flag("pydoc", choices=CORPORA, help="corpus (pydoc is embedded)")
    data_dir: str | None = flag(None, help="local folder with the wikitext2 / tinystories files")
    max_chars: int | None = flag(20_000_000, help="read at most this many characters per split (TinyStories is 2 GB)")
    tokenizer: str = flag("byte", choices=TOKENIZERS, help="byte, or bpe (trained with the tokenizers library)")
    bpe_vocab: int = flag(1024, help="BPE vocabulary size")
    methods: list[str] = flag(
        factory=lambda: list(DEFAULT_METHODS), name="--method", help=f"comma-separated priors ({', '.join(METHODS)})"
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    block: int = flag(64, help="context length in tokens")
    dim: int = flag(64, help="model width")
    depth: int = flag(3, help="transformer blocks")
    heads: int = flag(4, help="attention heads")
    steps: int = flag(1000, help="training steps")
    batch: int = flag(32, help="batch size (windows)")
    lr: float = flag(2e-3, help="peak learning rate (AdamW, warm-up then cosine)")
    weight_decay: float = flag(
        0.1, help="AdamW weight decay on linear weights and token embeddings (never positions, biases, norms or priors)"
    )
    warmup: float = flag(0.05, help="learning-rate warm-up, as a fraction of --steps")
    allowed: float = 6.0
    suppressed: float = 6.0
    evals: int = flag(10, help="evaluations during training")
    val_windows: int = flag(128, help="validation windows per evaluation")
    target_ppl: float = flag(8.0, help="validation perplexity for steps_to_target")


def quick_config() -> Config:
    return Config(seeds=[0], dim=32, depth=2, block=32, steps=300, evals=3, val_windows=32, target_ppl=12.0)


# reproduce: pydoc bytes, dim 64, depth 3, 4 heads, context 64, 4 methods (the defaults and the
# mask-zero control) x 3 seeds x 1000 steps of batch 32 (2M tokens, ~5 epochs); about 2-3 min
# per run on one thread. Quick keeps the default three methods (add --method ...,mask-zero).


def reproduce_config() -> Config:
    return Config(methods=[*DEFAULT_METHODS, "mask-zero"])


# ----------------------------------------------------------------------------- one run


@functools.lru_cache(maxsize=2)
def _tokens(corpus: str, data_dir: str | None, max_chars: int | None, tokenizer: str, bpe_vocab: int) -> TokenData:
    return tokenize(load_corpus(corpus, data_dir, max_chars), tokenizer, bpe_vocab)


def build_model(p: dict, vocab: int) -> GPT:
    """The GPT of ``p["method"]``: its priors (:func:`masklab.lab.train.priors_for`), with learned
    absolute positions for ``vanilla``, ``mask`` and ``mask-zero`` only."""
    method, T, H = p["method"], p["block"], p["heads"]
    if method not in METHODS:
        raise MasklabError(f"unknown LM prior {method!r}; choose from {', '.join(METHODS)}")
    if p.get("structures") is not None:  # a caller's structures, one (H|1, T, T) nested list per block (evidence-prior)
        structures = [torch.tensor(s, dtype=torch.float32) for s in p["structures"]]
    else:
        structures = [relative_distance(T, H)] * p["depth"]
    priors = priors_for(method, structures, p["allowed"], p["suppressed"])
    return GPT(vocab, T, p["dim"], p["depth"], H, priors, positions=method in ("vanilla", "mask", "mask-zero"))


@torch.no_grad()
def val_loss(model: GPT, windows: torch.Tensor, chunk: int = 64) -> float:
    """Mean next-token cross-entropy over validation windows ``(W, block + 1)``."""
    total = 0.0
    for i in range(0, len(windows), chunk):
        w = windows[i : i + chunk]
        total += float(model.loss(w[:, :-1], w[:, 1:])) * len(w)
    return total / len(windows)


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    """Train one causal LM and evaluate it; see the module docstring."""
    p = spec["params"]
    data = _tokens(p["corpus"], p["data_dir"], p["max_chars"], p["tokenizer"], p["bpe_vocab"])
    T = p["block"]
    if len(data.train) <= T + 1 or len(data.valid) <= T + 1:
        raise MasklabError(f"corpus {p['corpus']} is too short for a context of {T} tokens")
    starts = torch.linspace(0, len(data.valid) - T - 2, p["val_windows"]).long()
    windows = torch.stack([data.valid[s : s + T + 1] for s in starts])  # (W, T + 1), fixed
    gen = seed_everything(spec["seed"])
    model = build_model(p, data.vocab)
    device = dist.device()  # the run's device (--device; cuda:LOCAL_RANK under torchrun on GPUs)
    model.to(device)
    windows = windows.to(device)
    offsets = torch.arange(T + 1)

    def loss_of(net: torch.nn.Module, step: int) -> torch.Tensor:
        starts = torch.randint(
            len(data.train) - T - 1, (p["batch"],), generator=gen
        )  # global batch, same on every rank
        (w,) = dist.shard(data.train[starts[:, None] + offsets].to(device))  # (B / world, T + 1)
        logits, _ = net(w[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())

    def evaluate(step: int) -> dict:
        loss = val_loss(model, windows)
        return {"val_loss": loss, "val_ppl": math.exp(loss)}

    recipe = Recipe(p["steps"], p["lr"], p["weight_decay"], p["warmup"], floor=0.0, evals=p["evals"])
    trained = train(model, recipe, loss_of, evaluate, gen, ckpt_dir, f"{spec['task']}/{spec['method']}")
    curves = trained.curves
    metrics = {
        "val_ppl": curves["val_ppl"][-1],
        "best_val_ppl": min(curves["val_ppl"]),
        "val_loss": curves["val_loss"][-1],
        "steps_to_target": steps_to(curves["step"], curves["val_ppl"], p["target_ppl"], above=False),
        "train_loss": curves["train_loss"][-1],
        "mask_drift": curves["mask_drift"][-1],
    }
    extra = {
        "vocab": data.vocab,
        "train_tokens": len(data.train),
        "world_size": dist.world_size(),
        "resumed_from": trained.resumed_from,
    }
    return {"metrics": metrics, "curves": curves, "extra": extra}


# ----------------------------------------------------------------------------- study


def specs_for(cfg: Config) -> list[RunSpec]:
    base = {k: v for k, v in asdict(cfg).items() if k not in ("methods", "seeds")}
    return [RunSpec(cfg.corpus, m, s, {**base, "method": m}) for m in cfg.methods for s in cfg.seeds]


def validate(cfg: Config) -> None:
    check_choices("corpus", [cfg.corpus], CORPORA)
    check_choices("tokenizer", [cfg.tokenizer], TOKENIZERS)
    check_choices("method", cfg.methods, METHODS)
    if cfg.steps < 1 or cfg.batch < 1 or cfg.lr <= 0 or cfg.block < 2:
        raise MasklabError("--steps, --batch must be positive, --block >= 2 and --lr > 0")
    if cfg.dim % cfg.heads:
        raise MasklabError(f"--dim {cfg.dim} is not divisible by --heads {cfg.heads}")
    if cfg.corpus != "pydoc":
        load_corpus(cfg.corpus, cfg.data_dir, 1000)  # fail early on a bad data dir


NOTES = """\
Columns: `val_ppl` validation perplexity (exp of the mean next-token cross-entropy over fixed,
evenly spaced validation windows of the context length) at the end of training, `best_val_ppl`
its minimum over the evaluations, `steps_to_target` first evaluation step with val_ppl <=
the configured target (mean over the seeds that got there; `-` if none did), `train_loss`
mean training cross-entropy over the last evaluation interval, `mask_drift` mean |change| of
logsigmoid(M) (runs with a MaskPrior: mask, mask-nopos, mask-zero; mask-zero starts from a
uniform M = 0 and has no structure, so it measures what the prior's parameters alone do). \
Perplexities are per token of the chosen tokenizer
(per byte for `byte`). The paper reports only "modest but consistent gains" (no number)."""


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab lm") -> dict:
    validate(cfg)
    results = run_study(
        NAME,
        asdict(cfg),
        specs_for(cfg),
        "masklab.lab.studies.lm:run_one",
        out,
        jobs=jobs,
        paper=PAPER,
        progress=progress,
    )
    if dist.is_main():
        report(results, Path(out), command)
    return results


def report(results: dict, out: Path, command: str) -> None:
    figures = ["lm_val_ppl.png"]
    plot_curves(
        results["runs"],
        "val_ppl",
        out / figures[0],
        ylabel="validation perplexity",
        title="Validation perplexity",
        logy=True,
    )
    notes = NOTES + f"\nTarget perplexity: {results['config']['target_ppl']}."
    write_markdown(results, out, TABLE_METRICS, command, notes, figures)
