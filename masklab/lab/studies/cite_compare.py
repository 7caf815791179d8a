"""Study B on real LMs: our sentence-level evidence searches beside ContextCite.

Same model, same generated stale-fact prompts, same sentences. For every prompt the LM
answers; on the prompts it answers correctly every method names the sentences the answer
rests on: ``loo``, ``group-testing``, ``greedy-minimal`` (our searches; hiding = key
masking, "holds" = the answer stays greedy and its log-probability drops by less than
``tolerance`` nats) and ``contextcite`` (its Lasso surrogate over ``ablations`` random
ablations; its evidence is the top-attributed sentence).

Metrics per (model, method): ``gold_hit`` (the sentence with the current value is in
the evidence set / is ContextCite's top-1), ``top1_hit`` (the method's best sentence is
the gold one: the largest log-prob drop for ``loo``, the only item for a singleton set,
ContextCite's top attribution), ``set_size``, ``exact`` (the set is exactly the gold
sentence), ``agree_contextcite`` (ContextCite's top-1 is in our set), ``forward_passes``
and ``seconds`` per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from masklab.lab.report import write_markdown
from masklab.lab.runner import RunSpec, add_stats, summary_row, write_json
from masklab.lab.studies.per_model import load_model, model_specs, run_per_model

NAME = "cite"
# run_one loads its model on the run's device (per_model.load_model); generate and cite's
# answer_scores move their ids there and bring the results back to the CPU
DEVICES = ("cpu", "cuda")
RUN_METHOD = "all"  # one run per model evaluates every method of the config on the same prompts
METHODS = ("loo", "group-testing", "greedy-minimal", "contextcite")
TABLE_METRICS = [
    "gold_hit",
    "top1_hit",
    "set_size",
    "exact",
    "agree_contextcite",
    "forward_passes",
    "seconds",
    "n_prompts",
]


@dataclass
class Config:
    models: list[str] = field(default_factory=lambda: ["gemma3-270m", "smollm2-135m"])
    prompts: int = 10
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    ablations: int = 32
    tolerance: float = 1.0
    filler_max: int = 4
    prompt_format: str | None = None  # None: each model's default (see `masklab models`)
    threads: int = 1
    seeds: list[int] = field(default_factory=lambda: [0])


def quick_config() -> Config:
    return Config(prompts=2, ablations=16, filler_max=3)


def reproduce_config() -> Config:
    return Config()


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    from masklab.lab.lm_evidence import cite
    from masklab.pretrained.lm import encode, generate
    from masklab.lab.tasks.stale_prompts import make_prompts

    p = spec["params"]
    lm = load_model(spec)
    rows: dict[str, list[dict]] = {m: [] for m in p["methods"]}
    n_empty = 0
    for ex in make_prompts(p["prompts"], seed=2000 + spec["seed"], filler=(0, p["filler_max"])):
        cls = ex.classify(generate(lm, encode(lm, ex.sentences, ex.query).ids, 6)[1])
        n_empty += cls == "empty"  # counted apart: an empty answer has no evidence to find
        if cls != "current":
            continue
        found = {
            m: cite(
                lm, ex.sentences, ex.query, method=m, tolerance=p["tolerance"], contextcite_ablations=p["ablations"]
            )
            for m in p["methods"]
        }
        cc_top = int(np.argmax(found["contextcite"]["scores"])) if "contextcite" in found else None
        for m, r in found.items():
            ev = r["evidence"]
            top1 = int(np.argmax(r["scores"])) if r["scores"] is not None else (ev[0] if len(ev) == 1 else -1)
            row = {
                "gold_hit": float(ex.gold[0] in ev),
                "top1_hit": float(top1 == ex.gold[0]),
                "set_size": float(len(ev)),
                "exact": float(ev == ex.gold),
                "forward_passes": float(r["forward_passes"]),
                "seconds": r["seconds"],
            }
            if cc_top is not None and m != "contextcite":
                row["agree_contextcite"] = float(cc_top in ev)
            rows[m].append(row)
    metrics: dict = {"n_prompts": len(next(iter(rows.values()))), "n_empty": n_empty}
    for m, rs in rows.items():
        for k in ("gold_hit", "top1_hit", "set_size", "exact", "agree_contextcite", "forward_passes", "seconds"):
            vals = [r[k] for r in rs if k in r]
            if vals:
                metrics[f"{k}|{m}"] = float(np.mean(vals))
    return {"metrics": metrics, "curves": {}, "extra": {}}


def specs_for(cfg: Config) -> list[RunSpec]:
    return model_specs(cfg, "stale", RUN_METHOD)


def pivot(results: dict) -> list[dict]:
    """Summary rows per (model, method) from the flat ``metric|method`` metrics."""
    groups: dict[tuple[str, str], dict] = {}
    for run in results["runs"]:
        for k, v in run["metrics"].items():
            if "|" in k:
                metric, method = k.split("|")
                g = groups.setdefault((run["model"], method), {"n_prompts": []})
                g.setdefault(metric, []).append(v)
        for (model, method), g in groups.items():
            if model == run["model"]:
                g["n_prompts"].append(run["metrics"]["n_prompts"])
    out = []
    for (model, method), g in groups.items():
        row = summary_row(results["runs"][0]["task"], model, method, len(g["n_prompts"]))
        for metric, vals in g.items():
            add_stats(row, metric, vals)
        out.append(row)
    return out


NOTES = """\
Rows: one per (model, evidence method). Only prompts the model answers correctly
count (`n_prompts`). `gold_hit`: the current-value sentence is in the evidence set
(ContextCite: its top-1); `top1_hit`: the method's single best sentence is the gold one;
`agree_contextcite`: ContextCite's top-1 lies in our set; `forward_passes`: sequences
evaluated per prompt (ContextCite: its ablations + 1 generation; ours: variants + 1 full
pass); `seconds`: wall time per prompt on a shared CPU.
"""


def run(
    cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab reproduce pretrained"
) -> dict:
    res = run_per_model(NAME, cfg, specs_for(cfg), "masklab.lab.studies.cite_compare:run_one", out, jobs, progress)
    res["summary"] = pivot(res)
    write_json(Path(out) / "results.json", res)
    write_markdown(res, out, TABLE_METRICS, command, NOTES)
    return res
