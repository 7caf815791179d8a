"""Long-context evidence routing on real LMs: RULER-style tasks, pruning before prefill.

One run per (model, task, length, seed) on generated examples (:mod:`masklab.lab.tasks.longctx`).
Methods, each answering every example greedily, interleaved (example ``i`` runs the method
list rotated by ``i``, so machine noise hits all methods alike):

* ``full`` - the whole context;
* ``oracle-gold@<keep>`` - the oracle router: the gold evidence sentences plus random other
  sentences up to ``keep`` of the context's tokens; the rest is deleted before prefill
  (an upper bound for any router at that kept fraction);
* ``lexical@<keep>`` - sentences ranked by the words they share with the question, kept
  within ``keep`` (the floor a trained router must beat);
* ``evidence-router@<keep>`` / ``attention-router@<keep>`` - a logistic regression over
  sentence features read through the LM's first ``--router-layers`` layers over
  ``question + context`` (:mod:`masklab.context.routers.features`), trained on group-testing
  evidence sets of the LM's own answers, or on the LM's attention to the sentences, on
  ``--train-examples`` examples per task from seeds disjoint from the test examples;
  cached per (model, task set, length) in ``<out>/ckpt/routers`` (safetensors + JSON);
* ``bm25@<keep>``, ``dense@<keep>``, ``pruner@<keep>``, ... - the other registered text
  routers of ``--routers`` (:data:`TEXT_ROUTERS`), filled to ``keep``;
* ``<press>@<keep>`` - kvpress presses (``--compare``) in kvpress's own pipeline,
  compression ratio ``1 - keep`` (after a full prefill).

With ``--evidence N`` the first N examples of each run also get causal evidence sets:
group testing over sentences (or ``--chunk-tokens`` chunks of consecutive sentences) on the
model's own full-context answer, forward passes counted.

Summary rows: task ``<task>@<length>``, method; metrics ``acc`` (exact match), ``seconds``
(router + tokenise + prefill + decode per prompt, one thread), ``kept`` (kept fraction of
the context's tokens), ``gold_kept`` (the share of the gold sentences a router kept),
``gold_top`` (its best-scored sentences are exactly the gold ones), ``router_s`` / ``router_share``
(the router's seconds, and their share of the same example's full prefill), ``kv_mb``
(KV-cache size by formula after the answer), ``peak_mb`` (the run's peak resident memory:
one value per run, not per method), ``train_passes`` / ``train_labelled`` (the routers'
label cost and labelled examples), ``prefill_s`` (tokenise + prefill of the kept text, router
not included), and for ``full`` with evidence:
``ev_passes``, ``ev_seconds``, ``ev_size``, ``ev_gold_recall``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from masklab.util.errors import MasklabError
from masklab.util.flags import flag, float_list, int_list, list_or_none
from masklab.lab.report import markdown_table
from masklab.util.files import atomic_write_text, write_json
from masklab.lab.runner import RunSpec, add_stats, run_study, summary_row
from masklab.lab.tasks.longctx import MAX_TOKENS, MIN_TOKENS, TASKS
from masklab.lab.routers.registry import prune_one

NAME = "longctx"
# run_one loads its model on the run's device; answers, router features, presses and evidence move
# their ids to the model's device (masklab.context, masklab.pretrained.lm); on CUDA the prefill clock
# is read after torch.cuda.synchronize (every other clock follows a result read back on the CPU) and
# the run also records the GPU's peak memory (gpu_peak_mb)
DEVICES = ("cpu", "cuda")
MAX_EXAMPLES = 10_000  # per task and length: each is a long document read by a real LM (days of CPU past this)
TABLE_METRICS = [
    "acc",
    "seconds",
    "prefill_s",
    "kept",
    "gold_kept",
    "router_share",
    "kv_mb",
    "peak_mb",
    "ev_passes",
    "train_passes",
]


@dataclass
class Config:
    models: list[str] = flag(factory=lambda: ["smollm2-135m"], name="--model", help="comma-separated models")
    tasks: list[str] = flag(factory=lambda: list(TASKS), help=f"comma-separated tasks ({', '.join(TASKS)})")
    lengths: list[int] = flag(
        factory=lambda: [512, 1024],
        name="--length",
        parse=int_list,
        min=MIN_TOKENS,
        max=MAX_TOKENS,
        help=f"context lengths in model tokens ({MIN_TOKENS}..{MAX_TOKENS})",
    )
    keeps: list[float] = flag(
        factory=lambda: [0.25, 0.5],
        name="--keep",
        parse=float_list,
        above=0,
        max=1,
        help="kept fraction(s) of the context for the routers",
    )
    examples: int = flag(10, min=1, max=MAX_EXAMPLES, help="examples per task and length")
    evidence: int = flag(
        0, min=0, max=MAX_EXAMPLES, help="examples per task and length that also get group-testing evidence sets"
    )
    chunk_tokens: int | None = flag(
        None,
        min=1,
        help="evidence chunks: consecutive sentences of at most this many tokens (default: one chunk per sentence)",
        default_text="sentences",
    )
    routers: list[str] = flag(
        factory=lambda: ["lexical", "evidence", "attention"],
        parse=list_or_none,
        help="routers besides the oracle: lexical, bm25, longllmlingua, evidence "
        "(evidence-router), attention (attention-router), dense, bm25+dense, pruner, "
        "pruner-attention, pruner-marks; 'none' for none",
    )
    router_source: str = flag(
        "train",
        choices=["train", "shipped"],
        help="the evidence and attention routers: trained here on --train-examples of the "
        "test tasks (train), or the ones masklab ships, trained on other families (shipped)",
    )
    router_model: str | None = flag(
        None,
        metavar="MODEL",
        default_text="each --model's own, else smollm2-135m's",
        help="with --router-source shipped: the packaged model whose first layers and "
        "router rank the sentences (--model still answers)",
    )
    compare: list[str] = flag(
        factory=lambda: ["snapkv", "tova", "knorm", "streaming", "expected-attention"],
        parse=list_or_none,
        help="kvpress presses at the same kept fraction (snapkv, tova, knorm, streaming, "
        "expected-attention, and the question-aware snapkv-question and finch; adakv-<press> "
        "wraps one in AdaKV; 'none' for none)",
    )
    train_examples: int = flag(
        8, min=1, max=MAX_EXAMPLES, help="router training examples per task (seeds disjoint from the test examples)"
    )
    router_layers: int = flag(2, min=1, help="the routers read the LM's first this many layers over question + context")
    router_fill: bool = flag(
        False,
        help="the trained routers fill the kept fraction with their next-best sentences "
        "even where they score them as not evidence (default: stop at the decision boundary, "
        "so the kept fraction is a cap)",
    )
    hops: int = flag(3, min=1, help="vt: assignments after the value in the asked chain")
    updates: int = flag(2, min=1, help="stale: reassignments after the first statement")
    distractors: int = flag(3, min=1, help="multikey, multivalue: needles with other keys")
    count: int = flag(3, min=1, help="count: tallies of the asked colour; multivalue: needles of the asked key")
    max_new_tokens: int = flag(10, min=1, help="greedy answer tokens (multivalue: per needle of the asked key)")
    prompt_format: str | None = flag(
        None,
        choices=["raw", "chat"],
        default_text="each model's own, see `masklab models`",
        help="raw completion or the model's chat turns",
    )
    threads: int = flag(1, min=1, help="torch threads per run")
    seeds: list[int] = field(default_factory=lambda: [0])


def quick_config() -> Config:
    return Config(
        tasks=["niah", "stale"],
        lengths=[512],
        keeps=[0.25],
        examples=3,
        evidence=0,
        train_examples=2,
        compare=["snapkv", "streaming"],
    )


def reproduce_config() -> Config:
    """Both models at 1024 tokens on ``niah``, ``multikey``, ``vt`` and ``stale`` (a task a
    model fails at full context stays in the table, reported as such; ``count``, which both
    fail at 512, is left out), keep 0.25, 6 test and 4 training examples per task, the five
    presses and AdaKV-wrapped SnapKV: sized to fit 60 minutes with the two models in
    parallel on this 2-core machine (docs/longctx.md has the measured wall time)."""
    return Config(
        models=["smollm2-135m", "gemma3-270m"],
        tasks=["niah", "multikey", "vt", "stale"],
        lengths=[1024],
        keeps=[0.25],
        examples=6,
        train_examples=4,
        evidence=0,
        compare=["snapkv", "adakv-snapkv", "tova", "knorm", "streaming", "expected-attention"],
    )


ROUTER_METHODS = {"evidence": "evidence-router", "attention": "attention-router"}
TEXT_ROUTERS = (
    "lexical",
    "bm25",
    "longllmlingua",
    "evidence",
    "attention",
    "dense",
    "bm25+dense",
    "pruner",
    "pruner-attention",
    "pruner-marks",
)


def method_name(router: str) -> str:
    return ROUTER_METHODS.get(router, router)


def run_one(spec: dict, ckpt_dir: Path) -> dict:
    """All methods on one (model, task, length, seed) through the one evaluation loop
    (:func:`masklab.lab.pipeline.evaluate`: interleaved per example, each finished example
    appended to ``ckpt_dir/examples-<settings hash>.jsonl``, so a killed run continues after
    the last one with the same numbers)."""
    import torch

    from masklab.util import device as devices
    from masklab.lab import pipeline
    from masklab.lab.pipeline import peak_rss_mb
    from masklab.pretrained.models import load
    from masklab.lab.tasks.longctx import make_examples

    p = spec["params"]
    dev = devices.current()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    lm = load(spec["model"], attn="sdpa", threads=p["threads"], prompt_format=p.get("prompt_format"), device=dev)
    task_kw = {"hops": p["hops"], "updates": p["updates"], "distractors": p["distractors"], "count": p["count"]}
    examples = make_examples(
        p["task"], p["length"], p["examples"], seed=spec["seed"], tokenizer=lm.tokenizer, **task_kw
    )
    routers, rmeta = make_routers(lm, spec, task_kw, Path(ckpt_dir).parent / "routers")
    settings = hashlib.sha256(json.dumps({k: v for k, v in p.items() if k != "examples"}, sort_keys=True).encode())
    records = pipeline.evaluate(
        examples,
        methods(lm, p, spec["seed"], routers),
        Path(ckpt_dir) / f"examples-{settings.hexdigest()[:12]}.jsonl",
        after=lambda i, ex, rec: add_evidence(lm, p, i, ex, rec),
    )
    metrics: dict = {"peak_mb": peak_rss_mb(), "n": len(examples), **pipeline.means(records)}
    if dev.type == "cuda":  # the GPU's own peak (peak_mb is the process's resident memory)
        metrics["gpu_peak_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    metrics.update(label_cost(rmeta, records[0]["rows"]))
    answers = [
        {
            "answer": ex.answer,
            "n_tokens": ex.n_tokens,
            "prefill_s": r["rows"]["full"]["prefill_s"],
            **r["answers"],
            **({"evidence": r["evidence"]} if "evidence" in r else {}),
        }
        for ex, r in zip(examples, records)
    ]
    per_example = [{k: v for k, v in r["rows"].items() if k != "evidence"} for r in records]
    return {"metrics": metrics, "curves": {}, "extra": {"answers": answers, "router": rmeta, "examples": per_example}}


def label_cost(rmeta: dict | None, methods) -> dict:
    """``train_passes`` / ``train_labelled`` of each trained router's method: what the labels
    of a router trained here, or of a shipped one (its file says), cost."""
    if rmeta is None:
        return {}
    passes = rmeta.get("ev_passes", rmeta.get("label_cost", {}).get("passes"))
    labelled = rmeta.get("labelled", rmeta.get("data", {}).get("labelled"))
    trained = [m for m in methods if m.split("@")[0] in ROUTER_METHODS.values()]
    return {k: v for m in trained for k, v in ((f"train_passes|{m}", passes), (f"train_labelled|{m}", labelled))}


def make_routers(lm, spec: dict, task_kw: dict, cache: Path) -> tuple[dict, dict | None]:
    """``({router name: Router}, meta of the trained routers or None)``: the text routers of
    ``--routers``, the trained ones fitted here (cached in ``cache``) or shipped."""
    import sys

    from masklab.lab.linear_routers import train_or_load
    from masklab.lab.routers import factory, load_any

    p = spec["params"]
    trained = [r for r in p["routers"] if r in ROUTER_METHODS]
    routers = {r: load_any(r, lm) for r in p["routers"] if r not in ROUTER_METHODS}
    if trained and p.get("router_source", "train") == "shipped":
        routers.update({kind: load_any(kind, lm, router_model=p.get("router_model")) for kind in trained})
        return routers, routers[trained[0]].meta
    if not trained:
        return routers, None
    fitted, meta = train_or_load(
        lm,
        spec["model"],
        p["task_set"],
        p["length"],
        p["train_examples"],
        cache,
        seed=spec["seed"],
        task_kw=task_kw,
        max_new_tokens=p["max_new_tokens"],
        chunk_tokens=p["chunk_tokens"],
        layers=p["router_layers"],
        log=lambda m: print(m, file=sys.stderr),
    )
    routers.update({kind: factory(kind)(lm=lm, routers=fitted, meta=meta) for kind in trained})
    return routers, meta


def methods(lm, p: dict, seed: int, routers: dict):
    """``methods(i, example)`` for :func:`masklab.lab.pipeline.evaluate`: the full context,
    then per kept fraction the oracle, the routers and the presses (module docstring)."""
    from masklab.lab import pipeline
    from masklab.context.presses import PRESSES
    from masklab.lab.routers import factory

    new_tokens = p["max_new_tokens"] * (p["count"] if p["task"] == "multivalue" else 1)  # an answer lists count values
    oracle = factory("oracle-gold")(lm=lm)
    presses = {name: PRESSES[name](lm) for name in p["compare"]}

    def table(i: int, ex) -> list:
        oracle.seed = seed * 1000 + i
        out = [("full", pipeline.full(lm, new_tokens))]
        for k in p["keeps"]:
            out.append(
                (
                    f"oracle-gold@{k}",
                    pipeline.routed(lm, lambda ex, k=k: prune_one(oracle, ex, ex.question, k), new_tokens),
                )
            )
            for name, router in routers.items():
                fill = p.get("router_fill", False) if name in ROUTER_METHODS else True
                choose = lambda ex, k=k, r=router, fill=fill: prune_one(r, ex, ex.question, k, fill=fill)  # noqa: E731
                out.append((f"{method_name(name)}@{k}", pipeline.routed(lm, choose, new_tokens)))
            out += [(f"{name}@{k}", pipeline.pressed(lm, press, k, new_tokens)) for name, press in presses.items()]
        return out

    return table


def add_evidence(lm, p: dict, i: int, ex, record: dict) -> None:
    """With ``--evidence N``, the first N examples' group-testing evidence sets (over sentences,
    or ``--chunk-tokens`` chunks) on the model's own full-context answer: a row ``evidence``
    and the sets in ``record["evidence"]``."""
    from masklab.lab.linear_routers import chunk_units
    from masklab.lab.lm_evidence import cite

    if i >= p["evidence"]:
        return
    new_tokens = p["max_new_tokens"] * (p["count"] if p["task"] == "multivalue" else 1)
    chunks = chunk_units(ex.lengths(lm.tokenizer), p["chunk_tokens"])
    try:
        ev = cite(lm, [" ".join(ex.units[j] for j in c) for c in chunks], ex.query, max_new_tokens=new_tokens)
    except MasklabError:  # an empty answer has no evidence
        return
    items = sorted(j for c in ev["evidence"] for j in chunks[c])
    record["rows"]["evidence"] = {
        "ev_passes": ev["forward_passes"],
        "ev_seconds": ev["seconds"],
        "ev_size": len(ev["evidence"]),
        "ev_gold_recall": sum(g in items for g in ex.gold) / len(ex.gold),
    }
    record["evidence"] = {
        "items": items,
        "gold": ex.gold,
        "answer": ev["answer"],
        "n_sentences": len(ex.units),
        "n_chunks": len(chunks),
    }


def specs_for(cfg: Config) -> list[RunSpec]:
    """One run per (model, task, length, seed). Its settings name the trained routers it uses:
    routers trained here depend on the whole task set (``task_set``); shipped ones on their
    weights (``shipped_router``, a digest), so a run resumes only with the same routers."""
    from masklab.context.routers.trained import DEFAULT_ROUTER_MODEL
    from masklab.lab.realdocs import shipped_digest

    base = {k: v for k, v in asdict(cfg).items() if k not in ("models", "seeds", "tasks", "lengths")}
    if cfg.router_model is None:
        del base["router_model"]  # the settings of runs made before --router-model existed stay the same
    trained = any(r in ROUTER_METHODS for r in cfg.routers)

    def routers(model: str) -> dict:
        if not trained:
            return {}
        if cfg.router_source == "train":
            return {"task_set": list(cfg.tasks)}
        ranker = cfg.router_model or (model if shipped_digest(model) else DEFAULT_ROUTER_MODEL)
        return {"shipped_router": shipped_digest(ranker)}

    return [
        RunSpec(f"{t}@{n}", "all", s, {**base, "task": t, "length": n, **routers(m)}, model=m)
        for m in cfg.models
        for t in cfg.tasks
        for n in cfg.lengths
        for s in cfg.seeds
    ]


def pivot(results: dict) -> list[dict]:
    """Summary rows per (``<task>@<length>``, model, method); ``evidence`` metrics go on ``full``;
    ``n`` counts examples; means and stds are over runs (seeds)."""
    rows: dict[tuple[str, str, str], dict] = {}
    for run in results["runs"]:
        task = (run["task"], run["model"])
        methods = {k.split("|")[1] for k in run["metrics"] if "|" in k}
        for k, v in run["metrics"].items():
            if "|" in k:
                metric, method = k.split("|")
                method = "full" if method == "evidence" else method
                rows.setdefault((*task, method), {}).setdefault(metric, []).append(v)
        for method in methods - {"evidence"}:
            row = rows.setdefault((*task, method), {})
            row.setdefault("peak_mb", []).append(run["metrics"]["peak_mb"])
            if "gpu_peak_mb" in run["metrics"]:  # runs on CUDA only
                row.setdefault("gpu_peak_mb", []).append(run["metrics"]["gpu_peak_mb"])
            row.setdefault("examples", []).append(run["metrics"]["n"])
    out = []
    for (task, model, method), ms in rows.items():
        row = summary_row(task, model, method, int(sum(ms.pop("examples"))))  # n: examples, over seeds
        for metric, vals in ms.items():
            add_stats(row, metric, vals)
        add_intervals(row, [r for r in results["runs"] if (r["task"], r["model"]) == (task, model)])
        out.append(row)
    return out


def add_intervals(row: dict, runs: list[dict]) -> None:
    """From the per-example outcomes of ``runs`` (pooled over seeds): the Wilson 95% interval
    of ``acc`` (``acc_lo``, ``acc_hi``), the exact McNemar p against the full context
    (``p_full``) and against the evidence router at the same kept fraction (``p_evidence``),
    and the speed-up over the full context (mean seconds of ``full`` over this method's,
    ``speedup`` with a bootstrap 95% interval ``speedup_lo``/``speedup_hi``)."""
    from masklab.lab.stats import bootstrap_ratio, mcnemar, wilson

    method = row["method"]
    ex = [e for r in runs for e in r.get("extra", {}).get("examples", []) if method in e and "acc" in e[method]]
    if not ex:
        return
    acc = [bool(e[method]["acc"]) for e in ex]
    row["acc_lo"], row["acc_hi"] = wilson(sum(acc), len(acc))
    if method != "full" and all("full" in e for e in ex):
        row["p_full"] = mcnemar(acc, [bool(e["full"]["acc"]) for e in ex])
        lo, hi = bootstrap_ratio([e["full"]["seconds"] for e in ex], [e[method]["seconds"] for e in ex])
        row["speedup"] = sum(e["full"]["seconds"] for e in ex) / sum(e[method]["seconds"] for e in ex)
        row["speedup_lo"], row["speedup_hi"] = lo, hi
    keep = method.rsplit("@", 1)[-1]
    ev = f"evidence-router@{keep}"
    if "@" in method and method != ev and all(ev in e for e in ex):
        row["p_evidence"] = mcnemar(acc, [bool(e[ev]["acc"]) for e in ex])


NOTES = """\
`acc`: exact match of the greedy answer (cut at the first punctuation mark, number words
read as digits; `multivalue`: every number of the key among the answer's); \
`seconds`: router + tokenise + prefill + decode per prompt (methods
interleaved per example, one thread); `kept`: kept fraction of the context's tokens;
`gold_kept`: share of the gold sentences a router kept (`gold_top`: its best-scored
sentences are exactly the gold ones); `router_share`: the router's
seconds over the same example's full prefill; `kv_mb`: KV-cache MiB by formula (layers x 2
x KV heads x head dim x cached tokens x bytes; presses: kept context + the rest of the
prompt; AdaKV masks, so it caches all); `peak_mb`: peak resident memory of the run (one
value per run, shared by its methods; on CUDA `gpu_peak_mb` beside it: the GPU's peak allocated
memory); `train_passes`: forward passes the routers' labels
cost (group testing on the model's own answers; a pass reads from its first hidden token on);
`ev_passes`: group-testing evidence on the test examples (with `--evidence`).
"""


def validate(cfg: Config) -> None:
    """Everything the flag ranges do not say, before any model loads."""
    from masklab.context.presses import PRESSES
    from masklab.util.flags import check_ranges
    from masklab.pretrained.models import check_models, check_prompt_format

    check_ranges(cfg)
    check_models(cfg.models)
    check_prompt_format(cfg.prompt_format)
    bad = [t for t in cfg.tasks if t not in TASKS]
    if bad or not cfg.tasks:
        raise MasklabError(f"unknown long-context task(s) {', '.join(bad) or '(none)'}: use {', '.join(TASKS)}")
    if not cfg.lengths or not cfg.keeps:
        raise MasklabError("--length and --keep need at least one value")
    bad = [r for r in cfg.routers if r not in TEXT_ROUTERS]
    if bad:
        raise MasklabError(f"unknown router(s) {', '.join(bad)}: use {', '.join(TEXT_ROUTERS)} (or none)")
    if cfg.router_model is not None:
        if cfg.router_source != "shipped" or not any(r in ROUTER_METHODS for r in cfg.routers):
            raise MasklabError(
                "--router-model ranks with a shipped router: add --router-source shipped and "
                "--routers evidence or attention"
            )
        check_models([cfg.router_model])
    bad = [c for c in cfg.compare if c not in PRESSES]
    if bad:
        raise MasklabError(f"unknown press(es) {', '.join(bad)}: use {', '.join(PRESSES)} (or none)")


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab longctx") -> dict:
    validate(cfg)
    specs = specs_for(cfg)
    res = run_study(
        NAME,
        asdict(cfg),
        specs,
        "masklab.lab.studies.longctx:run_one",
        out,
        jobs=min(jobs, len(specs)),
        threads=cfg.threads,
        paper=[],
        progress=progress,
    )
    res["summary"] = pivot(res)
    res["paper"] = []
    write_json(Path(out) / "results.json", res)
    write_report(res, Path(out), command)
    return res


def write_report(res: dict, out: Path, command: str) -> None:
    env = res["environment"]
    gpu = ["gpu_peak_mb"] if any("gpu_peak_mb_mean" in r for r in res["summary"]) else []  # runs on CUDA only
    lines = [
        f"# {NAME}",
        "",
        f"Regenerate with: `{command}`",
        "",
        markdown_table(res["summary"], res["paper"], TABLE_METRICS + gpu),
        "",
        NOTES.strip(),
        "",
        f"Environment: python {env['python']}, torch {env['torch']}, {env['cpus']} CPUs, "
        f"{env.get('torch_threads_per_run')} thread(s) per run, git {env['git_rev']}.",
    ]
    atomic_write_text(out / "results.md", "\n".join(lines) + "\n")
