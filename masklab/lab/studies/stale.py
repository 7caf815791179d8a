"""Study B on real LMs: do pretrained models attend to the stale value even when right?

For every generated stale-fact prompt (:mod:`masklab.lab.tasks.stale_prompts`) the model
answers greedily; the answer is ``current``, ``stale`` or ``other`` (exact match). One
eager forward pass then gives the attention probabilities from the answer position (the
last prompt token, whose output predicts the first answer token) in every layer and head;
we sum them over the tokens of the stale value mentions and of the current value mention.

Metrics (over the prompts answered correctly unless said otherwise):

* ``accuracy``, ``stale_rate``, ``other_rate`` - answer classes over the prompts with a
  non-empty answer; ``empty_rate`` / ``n_empty`` - prompts answered with nothing
  (whitespace or an end-of-sequence token; a wrong prompt format for the model), counted
  apart and not scored;
* ``stale_higher`` - fraction of correct answers whose attention mass, summed over all
  layers and heads, is higher on a stale value mention (the most attended one, when
  there were several updates) than on the current value mention (the paper's claim is
  that this is common);
* ``stale_higher_heads`` - the same per (layer, head), averaged over all heads;
  ``best_head`` / ``worst_head`` - the largest / smallest per-head fraction;
* ``stale_layers`` - layers where most correct answers lean stale (head-mean mass);
* ``current_over_stale`` - mean mass on the current value / mean mass on the stale one;
* ``stale_higher_all`` - ``stale_higher`` over every prompt, right or wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from masklab.lab.report import write_markdown
from masklab.util.errors import MasklabError
from masklab.util.flags import flag, int_list
from masklab.lab.runner import RunSpec
from masklab.lab.studies.per_model import load_model, model_specs, prompt_format_flag, run_per_model

NAME = "stale"
# run_one loads its model on the run's device (per_model.load_model); generate and
# last_token_attention move the prompt's ids there and bring the results back to the CPU
DEVICES = ("cpu", "cuda")
METHOD = "answer-attention"  # greedy answer, then the attention from the answer position
TABLE_METRICS = [
    "accuracy",
    "empty_rate",
    "stale_rate",
    "stale_higher",
    "stale_higher_heads",
    "best_head",
    "worst_head",
    "stale_layers",
    "current_over_stale",
    "stale_higher_all",
    "n_correct",
]

PAPER = [
    # Allchin 2026 states the pretrained-LM finding qualitatively (no number): even when
    # they answer correctly, Qwen2.5 and Gemma attend more to the stale value.
]
PAPER_CLAIM = (
    "Pretrained LMs (Qwen2.5, Gemma): even when they answer correctly, they attend more to the "
    "stale value than to the current one (paper; qualitative, no number given)."
)


def min_max(name: str, least: int) -> Callable[[str], tuple[int, int]]:
    """Parser of ``--NAME min,max`` (``least <= min <= max``)."""

    def parse(text: str) -> tuple[int, int]:
        v = int_list(text)
        if len(v) != 2 or v[0] > v[1] or v[0] < least:
            raise MasklabError(f"--{name} takes min,max, e.g. 1,3")
        return v[0], v[1]

    return parse


@dataclass
class Config:
    models: list[str] = flag(
        factory=lambda: ["gemma3-270m", "smollm2-135m"], name="--model", help="comma-separated models"
    )
    prompts: int = flag(200, min=1, help="number of generated prompts per model")
    updates_min: int = flag(
        1,
        name="--updates",
        parse=min_max("updates", 1),
        metavar="MIN,MAX",
        default_text="1,3",
        apply=lambda v, base, up: {"updates_min": v[0], "updates_max": v[1]},
        help="min,max number of updates",
    )
    updates_max: int = 3
    filler_min: int = flag(
        0,
        name="--filler",
        parse=min_max("filler", 0),
        metavar="MIN,MAX",
        default_text="0,6",
        apply=lambda v, base, up: {"filler_min": v[0], "filler_max": v[1]},
        help="min,max distractor sentences per gap",
    )
    filler_max: int = 6
    max_new_tokens: int = 6
    prompt_format: str | None = prompt_format_flag()
    threads: int = flag(1, min=1, help="torch threads per run")
    seeds: list[int] = field(default_factory=lambda: [0])


def quick_config() -> Config:
    return Config(prompts=12, filler_max=3)


def reproduce_config() -> Config:
    return Config()


def measure(lm, p, max_new_tokens: int) -> dict:
    """One prompt: answer class and the ``(L, H)`` attention mass on stale / current value tokens."""
    from masklab.pretrained.lm import encode, generate, last_token_attention
    from masklab.lab.tasks.stale_prompts import score_answer

    enc = encode(lm, p.sentences, p.query)
    _, text = generate(lm, enc.ids, max_new_tokens)
    attn = last_token_attention(lm, enc.ids)  # (L, H, T)
    masks = [enc.token_mask([span]) for span in p.stale_spans + p.current_spans]
    if not all(m.any() for m in masks):
        raise MasklabError("a value mention maps to no token; the tokenizer's offsets are broken")
    mass = torch.stack([attn[:, :, m].sum(-1) for m in masks])  # (mentions, L, H)
    stale = mass[:-1]
    return {
        "answer": text,
        "class": score_answer(text, p),
        # the most attended stale mention, per head and overall (several updates give
        # several stale mentions; comparing their sum with one current mention would be unfair)
        "stale": stale.max(0).values.numpy(),  # (L, H)
        "stale_total": float(stale.sum((1, 2)).max()),
        "current": mass[-1].numpy(),
        "tokens": int(enc.ids.numel()),
    }


def aggregate(recs: list[dict]) -> tuple[dict, dict]:
    """Metrics over per-prompt records, and the per-layer / per-head fractions."""
    n_all = len(recs)
    n_empty = sum(r["class"] == "empty" for r in recs)
    recs = [r for r in recs if r["class"] != "empty"]  # an empty answer is not scored
    n = max(len(recs), 1)
    cls = [r["class"] for r in recs]
    ok = [r for r in recs if r["class"] == "current"]
    metrics = {
        "accuracy": cls.count("current") / n,
        "stale_rate": cls.count("stale") / n,
        "other_rate": cls.count("other") / n,
        "n_correct": len(ok),
        "n_prompts": n_all,
        "empty_rate": n_empty / n_all,
        "n_empty": n_empty,
        "mean_tokens": float(np.mean([r["tokens"] for r in recs])) if recs else float("nan"),
    }

    def overall(rs):
        return float(np.mean([r["stale_total"] > r["current"].sum() for r in rs])) if rs else float("nan")

    metrics["stale_higher_all"] = overall(recs)
    extra: dict = {}
    if ok:
        S = np.stack([r["stale"] for r in ok])  # (n, L, H)
        C = np.stack([r["current"] for r in ok])
        heads = (S > C).mean(0)  # (L, H)
        layers = (S.mean(2) > C.mean(2)).mean(0)  # (L,)
        metrics.update(
            {
                "stale_higher": overall(ok),
                "stale_higher_heads": float(heads.mean()),
                "best_head": float(heads.max()),
                "worst_head": float(heads.min()),
                "stale_layers": int((layers > 0.5).sum()),
                "current_over_stale": float(C.mean() / max(S.mean(), 1e-12)),
            }
        )
        L, H = heads.shape
        order = np.argsort(heads.flatten())
        extra = {
            "heads": heads.tolist(),
            "layers": layers.tolist(),
            "most_stale_heads": [[int(i // H), int(i % H), float(heads.flatten()[i])] for i in order[::-1][:5]],
            "most_current_heads": [[int(i // H), int(i % H), float(heads.flatten()[i])] for i in order[:5]],
            "stale_mass_by_layer": S.mean((0, 2)).tolist(),
            "current_mass_by_layer": C.mean((0, 2)).tolist(),
        }
    return metrics, extra


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    from masklab.lab.tasks.stale_prompts import make_prompts

    p = spec["params"]
    lm = load_model(spec, attn="eager")
    prompts = make_prompts(
        p["prompts"],
        seed=spec["seed"],
        updates=(p["updates_min"], p["updates_max"]),
        filler=(p["filler_min"], p["filler_max"]),
    )
    t0 = time.perf_counter()
    recs = [measure(lm, q, p["max_new_tokens"]) for q in prompts]
    metrics, extra = aggregate(recs)
    metrics["seconds_per_prompt"] = (time.perf_counter() - t0) / len(prompts)
    metrics["load_seconds"] = lm.load_seconds
    extra["prompt_format"] = lm.prompt_format
    extra["examples"] = [
        {"prompt": q.prompt, "values": q.values, "answer": r["answer"], "class": r["class"]}
        for q, r in list(zip(prompts, recs))[:3]
    ]
    extra["by_updates"] = {
        str(k): float(
            np.mean(
                [r["class"] == "current" for q, r in zip(prompts, recs) if q.n_updates == k and r["class"] != "empty"]
                or [float("nan")]
            )
        )
        for k in sorted({q.n_updates for q in prompts})
    }
    return {"metrics": metrics, "curves": {}, "extra": extra}


def specs_for(cfg: Config) -> list[RunSpec]:
    return model_specs(cfg, "stale", METHOD)


NOTES = f"""\
Claim under test: {PAPER_CLAIM}
`stale_higher` is the fraction of correctly answered prompts whose attention from the answer
position (summed over layers and heads) is larger on a stale value mention (the most
attended one when there are several updates) than on the current value mention; \
`stale_higher_heads` averages the same fraction over every (layer, head);
`best_head`/`worst_head` are its extremes; `stale_layers` counts layers where most correct
answers lean stale; `current_over_stale` is the ratio of mean masses. The claim holds for a
model if `stale_higher` is above 0.5.
"""


def heatmap(results: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results["runs"] if r["extra"].get("heads")]
    if not runs:
        return False
    fig, axes = plt.subplots(1, len(runs), figsize=(3.2 * len(runs) + 1, 5), squeeze=False)
    for ax, r in zip(axes[0], runs):
        h = np.array(r["extra"]["heads"])
        im = ax.imshow(h, vmin=0, vmax=1, cmap="coolwarm", aspect="auto", interpolation="nearest")
        ax.set_title(f"{r['model']} (seed {r['seed']})\nstale_higher={r['metrics']['stale_higher']:.2f}", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    fig.subplots_adjust(wspace=0.45)
    fig.colorbar(im, ax=axes[0].tolist(), label="fraction of correct answers with more attention on the stale value")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab stale") -> dict:
    if cfg.prompts < 1:
        raise MasklabError("--prompts must be at least 1")
    res = run_per_model(NAME, cfg, specs_for(cfg), "masklab.lab.studies.stale:run_one", out, jobs, progress, PAPER)
    figures = ["stale_heads.png"] if heatmap(res, Path(out) / "stale_heads.png") else []
    write_markdown(res, out, TABLE_METRICS, command, NOTES, figures)
    return res
