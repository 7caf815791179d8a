"""Study B on real LMs: prune the context for the LM at a budget; evidence router vs kvpress.

For each model: a sentence router (:mod:`masklab.context.routers.features`: features from the LM's
first layers over question + context, a logistic regression) is trained on generated
stale-fact prompts, once with causal evidence labels (leave-one-out with the LM itself)
and once with attention labels (the LM's most attended sentences). On fresh test
prompts every method keeps ``budget`` of the context's tokens and the LM answers from what
is kept:

* ``router-evidence``, ``router-attention`` - keep the routers' top sentences (the others
  are deleted from the text);
* ``attention-keep`` - keep the sentences the LM itself attends to most from the answer
  position (needs a dense pass with the question; the paper's "top attended" baseline);
* ``random`` - random sentences; ``full`` - no pruning (budget 1);
* kvpress presses (``snapkv``, ``knorm``, ``tova``, ``streaming``,
  ``expected-attention``) - drop ``1 - budget`` of the context's KV pairs at pre-fill;
  ``kvpress-full`` - the same kvpress pipeline with no press, on the same prompts: each
  press row's own full-context control (present whenever a press is compared).

Router labels: the evidence label of a training prompt is its leave-one-out evidence (the
sentences whose deletion changes the LM's correct answer). When leave-one-out finds no such
sentence (the answer survives every single deletion), the **last sentence** is labelled
instead (the fallback rule); ``n_fallback`` / ``fallback_rate`` count those prompts per run.

Metrics per (task @ budget, model, method) summary row: ``accuracy`` (exact match with the current value),
``gold_kept`` (the current-value sentence survived; sentence methods only), ``kept`` (the
kept fraction of context tokens), ``seconds`` (per answer, including the method's own
scoring). ``--task squad --squad FILE`` runs the same on SQuAD v1.1 questions (the
router is then trained on SQuAD questions too).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from masklab.text.query import Query
from masklab.lab.report import environment_line, markdown_table
from masklab.util.errors import MasklabError
from masklab.util.flags import flag, str_list
from masklab.util.files import atomic_write_text, write_json
from masklab.lab.runner import RunSpec, add_stats, summary_row
from masklab.lab.studies.per_model import load_model, model_specs, prompt_format_flag, run_per_model

NAME = "prune"
# run_one loads its model on the run's device (per_model.load_model); the labels, router features,
# attention and answers read it through masklab.pretrained.lm / masklab.context.routers.features, which move
# their ids to the model's device, and kvpress's pipeline runs on it (KVPressRunner)
DEVICES = ("cpu", "cuda")
RUN_METHOD = "all"  # one run per model trains the routers and evaluates every method and budget on the same prompts
SENTENCE_METHODS = ("router-evidence", "router-attention", "attention-keep", "random")
TABLE_METRICS = ["accuracy", "gold_kept", "kept", "cache_kept", "seconds"]
PAPER = [
    {
        "task": "stale",
        "method": "attention-keep",
        "metric": "accuracy",
        "value": "fails (keeps the stale fact; synthetic teacher, top 10%)",
    },
    {
        "task": "stale",
        "method": "router-evidence",
        "metric": "accuracy",
        "value": "identifies the latest statement (synthetic teacher)",
    },
]


def budget_list(text: str) -> list[float]:
    try:
        return [float(b) for b in str_list(text)]
    except ValueError:
        raise MasklabError(f"--budget takes fractions, got {text!r}") from None


@dataclass
class Config:
    models: list[str] = flag(factory=lambda: ["gemma3-270m"], name="--model", help="comma-separated models")
    task: str = flag("stale", choices=["stale", "squad"], help="generated stale-fact prompts or SQuAD v1.1")
    squad: str | None = flag(None, help="path to the official SQuAD v1.1 JSON (with --task squad)")
    budgets: list[float] = flag(
        factory=lambda: [0.3],
        name="--budget",
        parse=budget_list,
        above=0,
        max=1,
        help="kept fraction(s) of the context, e.g. 0.3 or 0.2,0.5",
    )
    compare: list[str] = flag(
        factory=lambda: ["snapkv", "knorm", "tova", "streaming", "expected-attention"],
        help="kvpress presses ('' for none)",
    )
    methods: list[str] = flag(
        factory=lambda: ["full", *SENTENCE_METHODS], help=f"sentence methods (full, {', '.join(SENTENCE_METHODS)})"
    )
    train_prompts: int = flag(40, min=1, help="router training prompts per model")
    test_prompts: int = flag(40, min=1, help="test prompts per model")
    filler_max: int = flag(6, min=0, help="at most this many distractor sentences per gap")
    max_new_tokens: int = 6
    prompt_format: str | None = prompt_format_flag()
    threads: int = flag(1, min=1, help="torch threads per run")
    seeds: list[int] = field(default_factory=lambda: [0])


def quick_config() -> Config:
    return Config(train_prompts=8, test_prompts=6, compare=["snapkv", "streaming"], filler_max=4)


def reproduce_config() -> Config:
    return Config()


def make_examples(p: dict, n: int, seed: int) -> list:
    if p["task"] == "stale":
        from masklab.lab.tasks.stale_prompts import make_prompts

        return make_prompts(n, seed=seed, filler=(0, p["filler_max"]))
    from masklab.lab.tasks.squad import load_squad, to_item

    items = [to_item(e) for e in load_squad(p["squad"])]
    items = [it for it in items if 2 <= len(it.sentences) <= 12]
    random.Random(seed).shuffle(items)
    return items[:n]


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    """Train the two routers on the LM's own labels, then answer every test prompt with every
    method and budget through the one evaluation loop (:func:`masklab.lab.pipeline.evaluate`;
    resumable from ``ckpt_dir/test-<settings hash>.jsonl``)."""
    import hashlib
    import json

    from masklab.lab import pipeline

    p = spec["params"]
    lm = load_model(spec, attn="sdpa")
    pool = make_examples(p, p["train_prompts"] + p["test_prompts"], 1000 + spec["seed"])
    train, test = pool[: p["train_prompts"]], pool[p["train_prompts"] :]
    if not test:
        raise MasklabError("no test examples: lower --train-prompts or give more data")
    routers, metrics = train_routers(lm, p, train, spec["seed"])
    settings = hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest()[:12]
    rng = random.Random(spec["seed"])  # drawn for every prompt up front, so a resumed run draws the same
    randoms = [[rng.random() for _ in ex.units] for ex in test]
    records = pipeline.evaluate(
        test, methods(lm, p, routers, randoms), Path(ckpt_dir) / f"test-{settings}.jsonl", after=finish_rows
    )
    rows = [
        (f"{name}|{b}" if "|" not in name else name, row)
        for r in records
        for name, row in r["rows"].items()
        for b in (p["budgets"] if "|" not in name else [None])
    ]  # full and kvpress-full: one row for every budget
    metrics["empty_rate"] = sum(row["empty"] for _, row in rows) / max(len(rows), 1)
    for key in dict.fromkeys(k for k, _ in rows):
        cell = [row for k, row in rows if k == key]
        scored = [row for row in cell if not row["empty"]]  # empty answers are counted apart, not scored
        metrics[f"empty|{key}"] = (len(cell) - len(scored)) / len(cell)
        metrics[f"accuracy|{key}"] = sum(row["acc"] for row in scored) / len(scored) if scored else float("nan")
        for m in ("seconds", "kept", "cache_kept", "gold_kept"):
            if m in cell[0]:
                metrics[f"{m}|{key}"] = sum(row[m] for row in cell) / len(cell)
    metrics["n_test"] = len(test)
    return {"metrics": metrics, "curves": {}, "extra": {}}


def train_routers(lm, p: dict, train: list, seed: int) -> tuple[dict, dict]:
    """``({method: LinearRouter}, metrics)``: the evidence and attention routers fitted on the
    training prompts the LM answers rightly (leave-one-out labels, the fallback rule in the
    module docstring), and what their labels cost."""
    from masklab.context.routers.features import features
    from masklab.lab.linear_routers import fit_routers, make_labels

    t0 = time.perf_counter()
    X, labels, label_passes, n_fallback = [], {"evidence": [], "attention": []}, 0, 0
    for ex in train:
        lab = make_labels(lm, ex, ex.query, accept=ex.is_correct, search="loo", max_new_tokens=p["max_new_tokens"])
        label_passes += lab["passes"]
        if lab["evidence"] is None:
            continue
        n_fallback += not lab["evidence"]  # no single deletion changed the answer: the last sentence is labelled
        X.append(features(lm, ex.units, ex.question))
        labels["evidence"].append(lab["evidence"] or [len(ex.units) - 1])
        labels["attention"].append(lab["attention"])
    used = len(X)
    if used < 2:
        raise MasklabError(f"{lm.name} answered fewer than 2 training prompts correctly; no router can be trained")
    fitted = fit_routers(X, labels, seed=seed)
    return {"router-evidence": fitted["evidence"], "router-attention": fitted["attention"]}, {
        "train_used": used,
        "label_passes_per_prompt": label_passes / max(len(train), 1),
        "n_fallback": n_fallback,
        "fallback_rate": n_fallback / used,
        "train_seconds": time.perf_counter() - t0,
    }


def methods(lm, p: dict, routers: dict, randoms: list[list[float]]):
    """``methods(i, example)`` for :func:`masklab.lab.pipeline.evaluate`: ``full`` and
    ``kvpress-full`` once, then per budget ``b`` the sentence methods ``<method>|<b>`` (each
    keeps its best-scored sentences: the routers' scores from one feature pass, the LM's own
    attention from one dense pass, ``randoms[i]``) and the presses ``<press>|<b>``."""
    from masklab.lab import pipeline
    from masklab.context.presses import PRESSES, KVPressRunner
    from masklab.context.router import Pruned
    from masklab.context.routers.features import features
    from masklab.lab.linear_routers import attention_per_unit
    from masklab.pretrained.lm import encode
    from masklab.text.selection import select

    kv = KVPressRunner(lm) if p["compare"] else None
    presses = {name: PRESSES[name](lm) for name in p["compare"]}
    new = p["max_new_tokens"]

    def kvpress_full(ex) -> tuple[dict, str]:
        from transformers import DynamicCache

        q, cache = Query.parse(ex.query), DynamicCache()  # the context positions prefilled: cache_tokens
        text, secs = kv.answer(ex.context, q.question_line, q.answer_line, None, 1.0, new, cache)
        return {
            "acc": float(ex.is_correct(text)),
            "seconds": secs,
            "kept": 1.0,
            "cache_tokens": int(cache.get_seq_length()),
        }, text

    def table(i: int, ex) -> list:
        lengths = ex.lengths(lm.tokenizer)
        t = time.perf_counter()
        feats = features(lm, ex.units, ex.question)
        feat_s = time.perf_counter() - t
        t = time.perf_counter()
        enc = encode(lm, ex.units, ex.query)
        att = attention_per_unit(lm, enc.ids, enc.item_of_token, len(ex.units))
        att_s = time.perf_counter() - t
        scores = {
            "router-evidence": (routers["router-evidence"].score(feats), feat_s),
            "router-attention": (routers["router-attention"].score(feats), feat_s),
            "attention-keep": (att, att_s),
            "random": (torch.tensor(randoms[i]), 0.0),
        }
        out = [("full", pipeline.full(lm, new))] if "full" in p["methods"] else []
        out += [("kvpress-full", kvpress_full)] if p["compare"] else []
        for b in p["budgets"]:
            for m in [m for m in p["methods"] if m in scores]:
                s, secs = scores[m]
                kept = Pruned(ex, select(s, lengths, b), s.tolist(), lengths, secs, m)
                out.append((f"{m}|{b}", pipeline.routed(lm, lambda ex, kept=kept: kept, new)))
            out += [(f"{name}|{b}", pipeline.pressed(lm, press, b, new)) for name, press in presses.items()]
        return out

    return table


def finish_rows(i: int, ex, record: dict) -> None:
    """``empty``: the answer was empty (counted apart: ``accuracy`` is over the others); a
    press's ``cache_kept``: the context positions it left in the cache over those
    ``kvpress-full`` left (measured, on the same prompt)."""
    rows = record["rows"]
    for name, row in rows.items():
        row["empty"] = ex.classify(record["answers"][name]) == "empty"
        if "cache_tokens" in row and name != "kvpress-full":
            row["cache_kept"] = row["cache_tokens"] / rows["kvpress-full"]["cache_tokens"]


def specs_for(cfg: Config) -> list[RunSpec]:
    return model_specs(cfg, cfg.task, RUN_METHOD)


def pivot(results: dict) -> list[dict]:
    """Summary rows per (task @ budget, model, method) from the flat per-run metrics."""
    rows: dict[tuple[str, str, str], dict] = {}
    for run in results["runs"]:
        for k, v in run["metrics"].items():
            if "|" not in k:
                continue
            metric, method, budget = k.split("|")
            task = f"{results['config']['task']}@{budget}"
            rows.setdefault((task, run["model"], method), {}).setdefault(metric, []).append(v)
    out = []
    for (task, model, method), ms in rows.items():
        row = summary_row(task, model, method, len(next(iter(ms.values()))))
        for metric, vals in ms.items():
            add_stats(row, metric, vals)
        out.append(row)
    return out


NOTES = """\
`accuracy`: exact match of the LM's answer with the current value, on test prompts, after
pruning; `kept`: fraction of context tokens kept (sentence methods keep whole sentences up
to the budget, so they keep at most the budget; presses: the fraction they are set to
keep); `cache_kept` (presses): the KV cache length after the press over that of
`kvpress-full`, measured; `kvpress-full`: kvpress's pipeline without a
press on the same prompts, the control of every press row; `gold_kept`: the sentence
holding the current value survived; `seconds`: per answer including the method's scoring
pass. The paper's numbers are for a synthetic teacher; here
the teacher is a small pretrained LM and the claims are tested, not assumed.
"""


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab prune") -> dict:
    from masklab.context.presses import PRESSES as PRESS_NAMES

    if cfg.task not in ("stale", "squad"):
        raise MasklabError(f"unknown task {cfg.task!r}: use stale or squad (with --squad FILE)")
    if cfg.task == "squad" and not cfg.squad:
        raise MasklabError("--task squad needs --squad PATH (the official SQuAD v1.1 JSON)")
    bad = [c for c in cfg.compare if c not in PRESS_NAMES]
    if bad:
        raise MasklabError(f"unknown press(es) {', '.join(bad)}: use {', '.join(PRESS_NAMES)}")
    bad = [m for m in cfg.methods if m not in ("full", *SENTENCE_METHODS)]
    if bad:
        raise MasklabError(f"unknown method(s) {', '.join(bad)}: use full, {', '.join(SENTENCE_METHODS)}")
    if not cfg.budgets or not all(0 < b <= 1 for b in cfg.budgets):
        raise MasklabError("--budget takes fractions in (0, 1], e.g. 0.3 or 0.2,0.5")
    res = run_per_model(NAME, cfg, specs_for(cfg), "masklab.lab.studies.prune:run_one", out, jobs, progress)
    res["summary"] = pivot(res)
    res["paper"] = PAPER
    write_json(Path(out) / "results.json", res)
    write_report(res, Path(out), command)
    return res


def write_report(res: dict, out: Path, command: str) -> None:
    lines = [
        f"# {NAME}",
        "",
        f"Regenerate with: `{command}`",
        "",
        markdown_table(res["summary"], res["paper"], TABLE_METRICS),
        "",
        NOTES.strip(),
        "",
    ]
    for r in res["runs"]:
        m = r["metrics"]
        fallback = (
            (
                f" The fallback rule (no leave-one-out evidence: the last sentence is labelled) labelled "
                f"{m['n_fallback']} of the {m['train_used']} ({m['fallback_rate']:.0%})."
            )
            if "n_fallback" in m
            else ""
        )
        lines.append(
            f"{r['model']} (seed {r['seed']}): routers trained on {m['train_used']} correctly answered prompts "
            f"({m['label_passes_per_prompt']:.1f} forward passes per prompt for the labels, "
            f"{m['train_seconds']:.0f} s); {m['n_test']} test prompts.{fallback}"
        )
    lines += ["", environment_line(res)]
    atomic_write_text(out / "results.md", "\n".join(lines) + "\n")
