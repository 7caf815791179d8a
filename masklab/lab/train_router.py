"""``masklab train-router``: train every shipped router kind (``--kind``) from the corpus or your documents.

* ``--kind evidence`` (the default without ``--docs``): the evidence and attention routers of a model,
  labelled on the generated families and measured on held-out ones (below);
* ``--kind pruner`` (the default with ``--docs``): the pruner (:mod:`masklab.lab.train_pruner`) on causal
  labels of your question / answer pairs (``--docs``, ``--questions``), or without them on the stored
  corpus labels (``results/corpus-labels``);
* ``--kind pruner-ctx``: the context pruner's head (:mod:`masklab.lab.train_ctx`) on the same labels of
  your pairs, or without them on the corpus (the shipped head's recipe: the ``union`` labels, its
  selection and ``--keep auto`` rule chosen on val);
* ``--kind pruner-passage``: the passage pruner's head (:mod:`masklab.lab.train_passage`, the default router)
  on your pairs (their marked evidence, else their causal sets), or without them on the corpus's marks;
* ``--kind cross`` refuses: the cross pruner left the product for the lab (below ``pruner-ctx`` on val);
  ``scripts/train_cross.py`` trains it.

The evidence routers:

1. **Labels** on the ``train`` families of :mod:`masklab.lab.tasks.families` at ``--length``
   tokens (short contexts make labels cheap; what a router learns from a unit and its
   question does not depend on how much filler surrounds it, which the held-out lengths
   check): the LM answers each example, and on a right answer group testing finds its
   evidence units and one eager pass its most attended units
   (:func:`masklab.lab.linear_routers.make_labels`). One JSON line per example in
   ``OUT/labels.jsonl``; a killed run resumes after the last labelled example, a rerun
   with more ``--examples`` labels only the new ones, and an example whose text changed
   (its digest, :attr:`~masklab.lab.tasks.families.FamilyExample.digest`) is labelled again;
   the routers are refitted whenever the labels differ from those they were fitted on.
   The first example labelled prices the rest (:func:`cost_estimate`, on standard error).
2. **Fit**: the evidence and the attention router (same features, data and model class)
   into ``OUT/<name>.safetensors`` + ``.json`` (the command, data, code hash, label cost;
   ``<name>``: :func:`masklab.context.routers.features.router_stem`, a model folder's own name). Fewer
   than :data:`MIN_LABELLED` rightly answered examples is one error (label more, or rank
   with a packaged router: ``--router-model``); fewer than ``FEW_LABELLED`` fits, with a
   ``warning`` in the JSON that the router repeats as a note wherever it is loaded.
3. **Held-out evaluation** (``--eval``): on the ``--eval-split`` families (``val`` to choose
   features, ``test`` to report), at each ``--eval-lengths``, ``--eval-examples`` per task
   kind: whether each router keeps every answering unit at ``--keep`` (``all_gold_kept``; the
   rows hold ``gold_kept``, the share kept), and (``gold_top``: whether its top-ranked units
   are exactly the answering ones, as many as there are: where word overlap cannot tell the
   latest statement or the asked key from the others, this is what differs), and with
   ``--eval-answers`` the answer from the kept text and from the full context, all measured
   by :mod:`masklab.lab.pipeline`. Rows per example in
   ``OUT/eval_rows_SPLIT[-answers]-WEIGHTS.jsonl`` (resumable; named after the routers'
   weights, and each row after its example's digest, so rows of other routers or of other
   text are never reused), the
   table with Wilson 95% intervals and paired McNemar p-values in
   ``OUT/eval_SPLIT[-answers].json`` / ``.md``.

The LM computes on ``device`` (``--device``; labels, router features and answers move their
ids to it) in ``precision`` (``--precision``: autocast around every pass); the router file's
meta and the evaluation file record both (:func:`masklab.util.device.describe`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from masklab.util import device as devices
from masklab.pretrained.models import DEFAULT_MODEL
from masklab.util.errors import MasklabError
from masklab.util.files import append_jsonl, atomic_write_text, make_out_dir, read_jsonl
from masklab.util.flags import add_flags, config_from_args, flag, int_list, str_list
from masklab.lab.routers.registry import prune_one

EVAL_METHODS = ("evidence", "attention", "lexical", "bm25")
KINDS = (
    "evidence",
    "pruner",
    "pruner-ctx",
    "pruner-passage",
    "cross",
)  # what --kind takes (run; cross: refused, in the lab)
MIN_LABELLED = 20  # fewer rightly answered training examples: no router is fitted (--quick: 2)


@dataclass
class TrainConfig:
    model: str = flag(DEFAULT_MODEL, help="registered model (see `masklab models`) or a model directory")
    out: str = flag("runs/router", metavar="DIR", help="output directory (labels, router files, evaluation)")
    examples: int = flag(70, min=1, help="training examples per task kind of the train families (4 kinds)")
    length: int = flag(384, min=256, max=8192, help="training context length in model tokens")
    features: str = flag("v3-relative", choices=["v3-relative", "v4-hop", "v2-superseded"], help="router feature set")
    layers: int = flag(2, min=1, help="the router reads the LM's first this many layers")
    max_new_tokens: int = flag(12, min=1, help="greedy answer tokens when labelling")
    seed: int = flag(0, help="seed of the training examples (evaluation examples use other seeds)")
    quick: bool = flag(
        False, help="a small run to check the pipeline (2 training examples per kind, no evaluation unless --eval)"
    )
    eval: bool = flag(False, help="measure the routers on held-out families")
    eval_split: str = flag(
        "test", choices=["val", "test"], help="families to measure on: val (choose features) or test (report)"
    )
    eval_lengths: list[int] = flag(
        factory=lambda: [1024, 2048], parse=int_list, min=256, max=8192, help="evaluation context lengths"
    )
    eval_examples: int = flag(30, min=1, help="evaluation examples per task kind and length")
    eval_answers: bool = flag(False, help="also answer from the kept text and from the full context (slow)")
    eval_kinds: list[str] = flag(
        factory=list,
        parse=str_list,
        default_text="every kind of the split",
        help="task kinds to evaluate (single, multikey, update, chain, multi)",
    )
    keep: float = flag(0.25, above=0, max=1, help="kept fraction in the evaluation")
    kind: str | None = flag(
        None,
        choices=list(KINDS),
        default_text="pruner with --docs, else evidence",
        help="what to train: evidence (the evidence and attention routers, on generated "
        "families), pruner, pruner-ctx or pruner-passage, the default router (on your --docs and --questions, "
        "else on the corpus labels); cross moved to the lab (scripts/train_cross.py)",
    )
    docs: str | None = flag(
        None,
        metavar="DIR",
        help="your own documents (text files): with --questions, label "
        "them with causal evidence and train a pruner for your domain instead of the routers",
    )
    questions: str | None = flag(
        None,
        metavar="FILE",
        help="with --docs: JSON lines {doc, question, answers, "
        "evidence?}, doc a file name in DIR, answers short written answers (the first is "
        "scored), evidence optional exact sentences",
    )
    causal_threshold: float | None = flag(
        None,
        metavar="NATS",
        default_text="the shipped pruner's, chosen on val",
        help="with --docs: a unit is in a question's causal set when keeping it "
        "raises the written answer's log-likelihood by more than this",
    )
    threads: int = flag(1, min=1, help="torch threads")
    progress: bool = flag(True, help="progress bars")
    command: str = field(default="", repr=False)
    # not flags here: the CLI's --device/--precision (masklab.cli.device_flags) set them
    device: str = "cpu"  # auto, cpu, cuda or cuda:N (masklab.util.device.resolve)
    precision: str = "fp32"  # fp32, or autocast to bf16 / fp16


def check(cfg: TrainConfig) -> None:
    from masklab.util.flags import check_ranges
    from masklab.lab.tasks.families import KINDS

    check_ranges(cfg)
    if cfg.kind == "cross":
        raise MasklabError(
            "--kind cross: the cross pruner left the product for the lab (below pruner-ctx on val); "
            "train it with python scripts/train_cross.py"
        )
    bad = [k for k in cfg.eval_kinds if k not in KINDS]
    if bad:
        raise MasklabError(f"unknown task kind {bad[0]!r}; choose from {', '.join(KINDS)}")


def _bar(items, progress: bool, desc: str):
    if not progress:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, file=sys.stderr)


def label(lm, cfg: TrainConfig, out: Path) -> list[dict]:
    """Label the training examples (resumable); returns one row per example."""
    from masklab.lab.linear_routers import make_labels
    from masklab.lab.tasks.families import split_examples

    n = 2 if cfg.quick else cfg.examples
    examples = split_examples("train", n, cfg.length, seed=cfg.seed, tokenizer=lm.tokenizer)
    path = out / "labels.jsonl"

    def key(r: dict) -> tuple:
        return r["kind"], r["seed"], r["template"], r["filler"]

    want = {key(vars(e)): e for e in examples}
    labelled = read_jsonl(path)
    if len(labelled) > len({key(r) for r in labelled}):
        raise MasklabError(f"{path} holds duplicate examples: remove it to label again")
    fresh = [r for r in labelled if key(r) not in want or r.get("example") == want[key(r)].digest]
    if len(fresh) < len(labelled):  # made from other text: labelled again, the rest kept
        print(
            f"{len(labelled) - len(fresh)} of the labelled examples in {path} were made from other text (the "
            "generator changed): labelling them again",
            file=sys.stderr,
        )
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in fresh))
    done = {key(r) for r in fresh}
    todo = sum(k not in done for k in want)
    for k, ex in _bar(list(want.items()), cfg.progress, f"labels {lm.name}"):
        if k in done:
            continue
        lab = make_labels(lm, ex, ex.query, accept=ex.is_correct, max_new_tokens=cfg.max_new_tokens)
        if todo:  # the first example labelled here prices the rest
            print(cost_estimate(todo, lab), file=sys.stderr, flush=True)
            todo = 0
        append_jsonl(
            path,
            {
                "kind": ex.kind,
                "seed": ex.seed,
                "template": ex.template,
                "filler": ex.filler,
                "wording": ex.wording,
                "example": ex.digest,
                "gold": ex.gold,
                "answer": lab["answer"],
                "correct": lab["correct"],
                "evidence": lab["evidence"],
                "attention": lab["attention"],
                "passes": lab["passes"],
                "seconds": lab["seconds"],
                "tokens": ex.n_tokens,
            },
        )
    return [r for r in read_jsonl(path) if key(r) in want]


def cost_estimate(examples: int, first: dict) -> str:
    """One line: ``examples`` x passes per example x seconds per pass, from the ``first``
    example's labels (:func:`masklab.lab.linear_routers.make_labels`); a first example answered
    wrongly (one pass) is priced at the shipped router's passes per labelled example."""
    from masklab.context.routers.trained import DEFAULT_ROUTER_MODEL, shipped
    from masklab.util.files import read_json

    per_pass = first["seconds"] / max(1, first["passes"])
    passes = first["passes"]
    if not first["correct"]:
        passes = read_json(shipped(DEFAULT_ROUTER_MODEL).with_suffix(".json"))["label_cost"]["passes_per_labelled"]
    total = examples * passes * per_pass
    return (
        f"labelling cost estimate: {examples} examples x {passes:.0f} passes x {per_pass:.2f} s per pass = "
        f"about {total / 60:.0f} min (measured on the first example; a wrongly answered one costs one pass)"
    )


def labels_digest(rows: list[dict]) -> str:
    """12 hex digits of sha256 over the labelled rows' examples and labels: the routers are
    refitted when it differs from the one their meta records."""
    data = [[r["example"], r["correct"], r["evidence"], r["attention"]] for r in rows]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:12]


def code_stamp() -> dict:
    """The code training runs (:mod:`masklab.lab.revision`), taken when training starts."""
    from masklab.lab.revision import code_ast, code_hash, git_rev

    return {
        "code": code_hash("masklab.lab.train_router"),
        "code_ast": code_ast("masklab.lab.train_router"),
        "git_rev": git_rev(),
    }


def fit(lm, cfg: TrainConfig, rows: list[dict], out: Path, stamp: dict | None = None) -> tuple[dict, dict]:
    """Fit both routers on the labelled rows and save them as ``OUT/<name>``
    (:func:`~masklab.context.routers.features.router_stem`); the meta records ``stamp``
    (:func:`code_stamp` taken when training started; now if None)."""
    from masklab.context.routers.trained import DEFAULT_ROUTER_MODEL, FEW_LABELLED
    from masklab.context.routers.features import features, load_routers, router_stem
    from masklab.lab.linear_routers import LABELS
    from masklab.lab.linear_routers import fit_routers, save_routers
    from masklab.lab.tasks.families import make_example

    labelled = [r for r in rows if r["correct"]]
    least = 2 if cfg.quick else MIN_LABELLED
    if len(labelled) < least:
        raise MasklabError(
            f"{lm.name} answered {len(labelled)} of {len(rows)} training examples rightly; a router needs "
            f"at least {least}: label more (--examples, now {cfg.examples} per kind), use a stronger "
            f"model, or rank with a packaged model's router (masklab compress --router-model "
            f"{DEFAULT_ROUTER_MODEL})"
        )
    feats, labels = [], {k: [] for k in LABELS}
    for r in labelled:
        ex = make_example(r["filler"], r["template"], r["wording"], r["kind"], cfg.length, r["seed"], lm.tokenizer)
        feats.append(features(lm, ex.units, ex.question, cfg.layers, kind=cfg.features))
        for k in LABELS:
            labels[k].append(r[k])
    routers = fit_routers(feats, labels, seed=cfg.seed)
    meta = {
        "model": lm.name,
        "features": cfg.features,
        "layers": cfg.layers,
        "command": cfg.command,
        "data": {
            "families": "train split of masklab.lab.tasks.families",
            "length": cfg.length,
            "examples": len(rows),
            "labels": labels_digest(rows),
            "labelled": len(labelled),
            "per_kind": {k: sum(r["kind"] == k for r in labelled) for k in sorted({r["kind"] for r in rows})},
        },
        "label_cost": {
            "passes": sum(r["passes"] for r in rows),
            "seconds": sum(r["seconds"] for r in rows),
            "passes_per_labelled": sum(r["passes"] for r in rows) / len(labelled),
            "seconds_per_labelled": sum(r["seconds"] for r in rows) / len(labelled),
        },
        "evidence_matches_gold": sum(sorted(r["evidence"]) == sorted(r["gold"]) for r in labelled) / len(labelled),
        **(stamp or code_stamp()),
        "search": "group-testing",
        "device": devices.describe(lm.model.device, cfg.precision),
    }
    if len(labelled) < FEW_LABELLED:
        meta["warning"] = (
            f"fitted on only {len(labelled)} labelled examples (fewer than {FEW_LABELLED}): its ranking may be poor"
        )
    save_routers(out / router_stem(lm.name), routers, meta)
    return load_routers(out / router_stem(lm.name))


def evaluate(lm, cfg: TrainConfig, routers: dict, meta: dict, out: Path) -> dict:
    """Held-out evaluation (module docstring) through the one evaluation loop
    (:func:`masklab.lab.pipeline.evaluate`); returns the results written to ``eval.json``."""
    from masklab.lab import pipeline
    from masklab.context.routers.features import router_stem
    from masklab.lab.routers import factory
    from masklab.util.files import write_json
    from masklab.lab.tasks.families import SPLITS, split_examples

    ranking = {
        name: factory(name)(lm=lm, **({"routers": routers, "meta": meta} if name in routers else {}))
        for name in EVAL_METHODS
    }
    kinds = cfg.eval_kinds or SPLITS[cfg.eval_split]["kind"]
    tag = cfg.eval_split + ("-answers" if cfg.eval_answers else "")
    weights = hashlib.sha256((out / f"{router_stem(lm.name)}.safetensors").read_bytes()).hexdigest()[:12]
    cells = [
        (n, ex)
        for n in cfg.eval_lengths
        for ex in split_examples(
            cfg.eval_split, cfg.eval_examples, n, seed=10_000 + cfg.seed, tokenizer=lm.tokenizer, kinds=kinds
        )
    ]
    length = [n for n, _ in cells]  # the asked length of example i (its own n_tokens is what it came to)

    def methods(i: int, ex) -> list:
        choose = {
            name: lambda ex, r=r: prune_one(r, ex, ex.question, cfg.keep, fill=True) for name, r in ranking.items()
        }
        if not cfg.eval_answers:
            return [(name, pipeline.ranked(c)) for name, c in choose.items()]
        answer = {"stop_at_sentence": True, "new_tokens": cfg.max_new_tokens}
        return [("full", pipeline.full(lm, **answer))] + [
            (n, pipeline.routed(lm, c, **answer)) for n, c in choose.items()
        ]

    def describe(i: int, ex, record: dict) -> None:
        record.update(
            {
                "length": length[i],
                "kind": ex.kind,
                "seed": ex.seed,
                "example": ex.digest,
                "template": ex.template,
                "filler": ex.filler,
                "tokens": ex.n_tokens,
                "gold": ex.gold,
                "router": weights,
            }
        )

    # rows of these routers (their weights) and of this text (each example's digest) only
    records = pipeline.evaluate(
        [ex for _, ex in cells],
        methods,
        out / f"eval_rows_{tag}-{weights}.jsonl",
        key=lambda i, ex: f"{length[i]}/{ex.kind}/{ex.seed}/{ex.digest}",
        after=describe,
        progress=lambda todo: _bar(todo, cfg.progress, f"held-out {cfg.eval_split} {lm.name}"),
    )
    res = {
        "command": cfg.command,
        "model": lm.name,
        "split": cfg.eval_split,
        "keep": cfg.keep,
        "router": meta,
        "config": asdict(cfg),
        "device": devices.describe(lm.model.device, cfg.precision),
        "summary": summarise(records, cfg.eval_answers),
        "rows": records,
    }
    write_json(out / f"eval_{tag}.json", res)
    (out / f"eval_{tag}.md").write_text(markdown(res) + "\n")
    return res


def _kept_rates(rows: list[dict]) -> dict:
    """``all_gold_kept`` (every gold unit kept) and ``gold_top`` over ``rows`` (one method's), with Wilson intervals."""
    from masklab.lab.stats import wilson

    out = {}
    for metric, hits in (
        ("all_gold_kept", [r["gold_kept"] == 1.0 for r in rows]),
        ("gold_top", [r["gold_top"] == 1.0 for r in rows]),
    ):
        k = sum(hits)
        lo, hi = wilson(k, len(rows))
        out.update({metric: k / len(rows), f"{metric}_lo": lo, f"{metric}_hi": hi})
    return out


def summarise(records: list[dict], answers: bool, methods: tuple[str, ...] = EVAL_METHODS) -> list[dict]:
    """One row per (length, kind, method): n, ``all_gold_kept`` (the share of examples whose
    every gold unit was kept) and ``gold_top`` with their Wilson intervals, kept fraction,
    router seconds; with answers ``acc`` (interval), McNemar p against the full context, the
    speed-up over the full context (router included, with a bootstrap interval) and
    ``router_share`` (router seconds over the full prefill's); for the evidence router,
    McNemar p against each other method. Without answers, one more row per method, task
    ``all``: ``all_gold_kept`` and ``gold_top`` over every example. ``methods``: the routers
    measured, in the order of the rows."""
    from masklab.lab.stats import bootstrap_ratio, mcnemar, wilson

    out = []
    for n_tok in sorted({r["length"] for r in records}):
        for kind in sorted({r["kind"] for r in records}):
            cell = [r["rows"] for r in records if r["length"] == n_tok and r["kind"] == kind]
            for m in (["full"] if "full" in cell[0] else []) + [m for m in methods if m in cell[0]]:
                rows = [c[m] for c in cell]
                s = {"task": f"{kind}@{n_tok}", "method": m, "n": len(cell)}
                if m != "full":
                    s.update(_kept_rates(rows))
                    s["kept"] = sum(r["kept"] for r in rows) / len(rows)
                    s["router_seconds"] = sum(r["router_s"] for r in rows) / len(rows)
                if "acc" in rows[0]:
                    k = sum(r["acc"] for r in rows)
                    lo, hi = wilson(int(k), len(rows))
                    s.update({"acc": k / len(rows), "acc_lo": lo, "acc_hi": hi})
                    if m != "full":
                        full = [c["full"] for c in cell]
                        s["p_vs_full"] = mcnemar([r["acc"] == 1 for r in rows], [r["acc"] == 1 for r in full])
                        full_s, own_s = [r["seconds"] for r in full], [r["seconds"] for r in rows]
                        s["speedup"] = sum(full_s) / sum(own_s)
                        s["speedup_lo"], s["speedup_hi"] = bootstrap_ratio(full_s, own_s)
                        s["router_share"] = sum(r["router_s"] for r in rows) / sum(r["prefill_s"] for r in full)
                if m == "evidence" and all(o in cell[0] for o in ("attention", "lexical", "bm25")):
                    for other in ("attention", "lexical", "bm25"):
                        theirs = [c[other] for c in cell]
                        s[f"p_gold_vs_{other}"] = mcnemar(
                            [r["gold_kept"] == 1 for r in rows], [r["gold_kept"] == 1 for r in theirs]
                        )
                        s[f"p_top_vs_{other}"] = mcnemar(
                            [r["gold_top"] == 1 for r in rows], [r["gold_top"] == 1 for r in theirs]
                        )
                        if "acc" in rows[0]:
                            s[f"p_acc_vs_{other}"] = mcnemar(
                                [r["acc"] == 1 for r in rows], [r["acc"] == 1 for r in theirs]
                            )
                out.append(s)
    if answers:
        return out
    for m in methods:  # pooled over every kind and length: what features are chosen by
        rows = [r["rows"][m] for r in records if m in r["rows"]]
        out.append({"task": "all", "method": m, "n": len(rows), **_kept_rates(rows)})
    return out


def markdown(res: dict) -> str:
    lines = [
        f"# Held-out routers: {res['model']} on the {res['split']} families, keep {res['keep']}",
        "",
        "| task | method | n | all_gold_kept [95% CI] | gold_top [95% CI] | kept | acc [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in res["summary"]:
        g = (
            f"{s['all_gold_kept']:.3f} [{s['all_gold_kept_lo']:.2f}, {s['all_gold_kept_hi']:.2f}]"
            if "all_gold_kept" in s
            else "-"
        )
        t = f"{s['gold_top']:.3f} [{s['gold_top_lo']:.2f}, {s['gold_top_hi']:.2f}]" if "gold_top" in s else "-"
        a = f"{s['acc']:.3f} [{s['acc_lo']:.2f}, {s['acc_hi']:.2f}]" if "acc" in s else "-"
        k = f"{s['kept']:.3f}" if "kept" in s else "-" if s["task"] == "all" else "1.000"
        lines.append(f"| {s['task']} | {s['method']} | {s['n']} | {g} | {t} | {k} | {a} |")
    return "\n".join(lines)


def run(cfg: TrainConfig) -> int:
    check(cfg)
    kinds = {"evidence": run_families, "pruner": run_pruner, "pruner-ctx": run_ctx, "pruner-passage": run_passage}
    return kinds[kind_of(cfg)](cfg)


def kind_of(cfg: TrainConfig) -> str:
    """The kind to train (``--kind``; without it, a pruner where documents are given)."""
    return cfg.kind or ("pruner" if cfg.docs or cfg.questions else "evidence")


def run_families(cfg: TrainConfig) -> int:
    """``--kind evidence``: the evidence and attention routers (module docstring)."""
    from masklab.context.routers.features import load_routers, router_stem
    from masklab.pretrained.models import check_models, load

    if cfg.docs or cfg.questions:
        raise MasklabError(
            "--kind evidence trains on the generated families; --docs and --questions train a pruner "
            "(--kind pruner or pruner-ctx)"
        )
    stamp = code_stamp()  # before labelling, which takes hours: the code that runs, not the code at the end
    dev = devices.resolve(cfg.device)  # one clear error for cuda without a GPU, before anything is written
    devices.check_precision(cfg.precision)
    check_models([cfg.model])
    out = make_out_dir(cfg.out)
    lm = load(cfg.model, threads=cfg.threads, device=dev)
    t0 = time.perf_counter()
    with devices.autocast(dev, cfg.precision):
        rows = label(lm, cfg, out)
        stem = out / router_stem(lm.name)
        routers, meta = load_routers(stem) if stem.with_suffix(".safetensors").exists() else (None, {})
        if cfg.quick or (
            meta.get("features"),
            meta.get("layers"),
            meta.get("data", {}).get("labels"),
            meta.get("data", {}).get("length"),
        ) != (cfg.features, cfg.layers, labels_digest(rows), cfg.length):
            routers, meta = fit(lm, cfg, rows, out, stamp)  # refit when the data or the recipe changed
        cost = meta["label_cost"]
        print(
            f"routers: {stem}.safetensors ({meta['data']['labelled']} of {meta['data']['examples']} training "
            f"examples labelled; {cost['passes_per_labelled']:.1f} passes and {cost['seconds_per_labelled']:.1f} s per "
            f"labelled example; {time.perf_counter() - t0:.0f} s)"
        )
        if meta.get("warning"):
            print(f"warning: this router was {meta['warning']}; label more with --examples", file=sys.stderr)
        print(f"use them: masklab compress --model {cfg.model} --router evidence --router-file {stem}.safetensors ...")
        if cfg.eval:
            print(markdown(evaluate(lm, cfg, routers, meta, out)))
    return 0


MIN_PAIRS = 20  # fewer usable question / answer pairs in --questions: refused before the model loads


def read_pairs(docs: str, questions: str) -> list:
    """The usable pairs of ``--questions`` about the files of ``--docs``, as
    :class:`~masklab.lab.tasks.realdocs.RealQuestion` s; one clear error for a malformed line
    or fewer than :data:`MIN_PAIRS`."""
    from masklab.text.inputs import read_text
    from masklab.lab.tasks.realdocs import RealQuestion

    folder, qfile = Path(docs).expanduser(), Path(questions).expanduser()
    if not folder.is_dir():
        raise MasklabError(f"--docs {docs} is not a folder")
    if not qfile.is_file():
        raise MasklabError(f"--questions {questions} does not exist")
    texts: dict[str, str] = {}
    out = []
    for n, line in enumerate(qfile.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{qfile.name}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise MasklabError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("doc"), str) or not isinstance(row.get("question"), str):
            raise MasklabError(f'{where}: needs "doc" (a file name in {docs}) and "question" strings')
        answers = row.get("answers")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise MasklabError(f'{where}: "answers" must be a non-empty list of short answers')
        path = folder / row["doc"]
        if row["doc"] not in texts:
            if not path.is_file():
                raise MasklabError(f"{where}: no document {path}")
            texts[row["doc"]] = read_text(str(path))
        text = texts[row["doc"]]
        evidence = row.get("evidence", [])
        if not isinstance(evidence, list) or any(not isinstance(e, str) or e not in text for e in evidence):
            raise MasklabError(f'{where}: "evidence" must be a list of exact sentences of {row["doc"]}')
        if not row["question"].strip():
            continue
        out.append(
            RealQuestion(
                f"{Path(row['doc']).stem}-{n}",
                row["doc"],
                "single",
                row["question"].strip(),
                tuple(e for e in evidence if text.count(e) == 1),
                tuple(answers),
                text,
            )
        )
    if len(out) < MIN_PAIRS:
        raise MasklabError(
            f"{questions} has {len(out)} usable question / answer pairs; a pruner needs at least "
            f"{MIN_PAIRS} (write more, or use the shipped pruner: masklab compress --router pruner)"
        )
    return out


def pruner_labels(cfg: TrainConfig):
    """``(tokenizer, label rows, questions by id)`` for the pruner kinds: causal labels of your pairs with
    ``--model`` (``--docs``, ``--questions``; resumable, ``OUT/labels.jsonl``, a cost estimate after the
    first), or the stored corpus labels of ``--model`` (``results/corpus-labels``)."""
    from masklab.lab.labels import label_questions
    from masklab.pretrained.models import check_models, load

    if bool(cfg.docs) != bool(cfg.questions):
        raise MasklabError("--docs and --questions go together (your documents and your questions about them)")
    if not cfg.docs:
        return corpus_labels(cfg)
    pairs = read_pairs(cfg.docs, cfg.questions)
    dev = devices.resolve(cfg.device)
    check_models([cfg.model])
    out = make_out_dir(cfg.out)
    lm = load(cfg.model, threads=cfg.threads, device=dev)
    path = out / "labels.jsonl"
    with devices.autocast(dev, cfg.precision):
        first = label_questions(lm, pairs[:1], path, progress=False)
        if len(first) == 1 and len(pairs) > 1:
            s = first[0]["seconds"]
            print(
                f"labelling cost estimate: {len(pairs)} pairs x {first[0]['passes']} passes, {s:.1f} s each = "
                f"about {len(pairs) * s / 60:.0f} min",
                file=sys.stderr,
                flush=True,
            )
        rows = label_questions(lm, pairs, path, progress=cfg.progress)
    return lm.tokenizer, rows, {q.id: q for q in pairs}


def corpus_labels(cfg: TrainConfig):
    """:func:`pruner_labels` from the stored corpus labels of ``--model`` (one error where none are stored)."""
    from masklab.lab.tasks import realdocs
    from masklab.lab.train_ctx import CORPUS_LABELS
    from masklab.pretrained.models import check_models, load

    files = sorted(CORPUS_LABELS.glob(f"labels-{cfg.model}-train*.jsonl"))
    if not files:
        raise MasklabError(
            f"no corpus labels for {cfg.model} in {CORPUS_LABELS} (scripts/label_corpus.py makes "
            "them): train on your own documents instead (--docs, --questions)"
        )
    check_models([cfg.model])
    rows = list({r["key"]: r for f in files for r in read_jsonl(f)}.values())
    corpus = {q.id: q for q in realdocs.load("all", realdocs.CORPUS)}
    return load(cfg.model, threads=cfg.threads).tokenizer, rows, {r["id"]: corpus[r["id"]] for r in rows}


def run_pruner(cfg: TrainConfig) -> int:
    """``--kind pruner``: a pruner of the shipped design trained on causal labels
    (:func:`pruner_labels`): ``OUT/pruner-causal.safetensors``."""
    from masklab.lab.train_pruner import TrainConfig as PrunerConfig
    from masklab.lab.train_pruner import examples_of, save, shipped_recipe, train

    t0 = time.perf_counter()
    tokenizer, rows, questions = pruner_labels(cfg)
    recipe = shipped_recipe()
    if cfg.causal_threshold is not None:
        recipe["threshold"] = cfg.causal_threshold
    model, rec = train(
        examples_of(rows, questions, tokenizer, "causal", recipe["threshold"]),
        PrunerConfig(design=recipe["design"], labels="causal", threshold=recipe["threshold"]),
        cfg.progress,
    )
    target = make_out_dir(cfg.out) / "pruner-causal.safetensors"
    save(
        model,
        target,
        {
            "labels": "causal",
            "threshold": recipe["threshold"],
            "model": cfg.model,
            "labelled": len(rows),
            "train_examples": rec["examples"],
            "keep_auto": recipe["keep_auto"],
            "docs": cfg.docs,
            "questions": cfg.questions,
            "command": cfg.command,
            "loss": rec["loss"],
        },
    )
    print(
        f"pruner: {target} ({len(rows)} pairs labelled, {rec['examples']} with a causal set; "
        f"{time.perf_counter() - t0:.0f} s)"
    )
    print(f"use it: masklab compress --router pruner --router-file {target} --keep auto ...")
    return 0


def run_ctx(cfg: TrainConfig) -> int:
    """``--kind pruner-ctx``: the context pruner's head. On the corpus, the shipped recipe
    (:func:`masklab.lab.train_ctx.run_corpus` for the ``union`` labels: ``OUT/ctx-union.safetensors``
    and ``OUT/results.json``); on your pairs, the head trained on their causal sets over the shipped
    pruner's embeddings, with the shipped head's selection and ``--keep auto`` rule
    (``OUT/ctx-causal.safetensors``)."""
    from masklab.context.contextual import load_head
    from masklab.context.routers.pruner import WEIGHTS, ContextPruner, cached_pruner
    from masklab.lab.train_ctx import Example, HeadConfig, run_corpus, save, targets, train
    from masklab.lab.train_pruner import shipped_recipe
    from masklab.text.document import segment

    t0 = time.perf_counter()
    if not cfg.docs and not cfg.questions:
        run_corpus(cfg.model, [ContextPruner.labels], make_out_dir(cfg.out), cfg.command, threads=cfg.threads)
        target = Path(cfg.out) / f"ctx-{ContextPruner.labels}.safetensors"
    else:
        tokenizer, rows, questions = pruner_labels(cfg)
        threshold = shipped_recipe()["threshold"] if cfg.causal_threshold is None else cfg.causal_threshold
        emb = cached_pruner(str(WEIGHTS / "causal.safetensors"))[0].embedder
        units = {q.doc: emb.units(segment(q.text, tokenizer).units) for q in questions.values()}
        qvec = dict(zip(questions, emb.encode([q.question for q in questions.values()])))
        examples = [
            Example(units[questions[r["id"]].doc], qvec[r["id"]], targets(r, None, "lasso", threshold)) for r in rows
        ]
        head, rec = train(examples, HeadConfig())
        shipped = load_head(WEIGHTS / f"ctx-{ContextPruner.labels}.safetensors")[1]
        target = make_out_dir(cfg.out) / "ctx-causal.safetensors"
        save(
            head,
            target,
            {
                "labels": "causal",
                "threshold": threshold,
                "model": cfg.model,
                "labelled": len(rows),
                "train": rec,
                "docs": cfg.docs,
                "questions": cfg.questions,
                "command": cfg.command,
                **{k: shipped.get(k) for k in ("keep_auto", "keep_rule", "context")},
            },
        )
    print(f"context pruner: {target} ({time.perf_counter() - t0:.0f} s)")
    print(f"use it: masklab compress --router pruner-ctx --router-file {target} --keep auto ...")
    return 0


def run_passage(cfg: TrainConfig) -> int:
    """``--kind pruner-passage``: the passage pruner's head (:mod:`masklab.lab.train_passage`). On the corpus,
    the shipped recipe (every variant on the writers' marks of the labelled training questions, measured on
    val: ``OUT/results.json``, ``OUT/passage-one-hop.safetensors``); on your pairs, the shipped head's
    variant trained on their marked evidence where a pair gives it, else on their causal sets, with the shipped
    head's selection and ``--keep auto`` rule (``OUT/passage-causal.safetensors``)."""
    from masklab.context.passage import FEATURES, hop_query, masked, passage_features
    from masklab.context.routers.passage import PassagePruner
    from masklab.context.routers.pruner import WEIGHTS, cached_pruner
    from masklab.lab.tasks.realdocs import answering_units, question_document
    from masklab.lab.train_ctx import Example, HeadConfig, save, targets, train
    from masklab.lab.train_passage import run as run_corpus
    from masklab.lab.train_pruner import shipped_recipe
    from masklab.util.files import read_json

    t0 = time.perf_counter()
    shipped = read_json(PassagePruner.weights_file().with_suffix(".json"))
    variant = shipped.get("variant", "two-hop")
    if not cfg.docs and not cfg.questions:
        out = make_out_dir(cfg.out)
        run_corpus(cfg.model, out, cfg.command, HeadConfig.epochs, labels=shipped.get("labels", "marks"))
        target = out / f"passage-{variant}.safetensors"
    else:
        tokenizer, rows, questions = pruner_labels(cfg)
        threshold = shipped_recipe()["threshold"] if cfg.causal_threshold is None else cfg.causal_threshold
        emb = cached_pruner(str(WEIGHTS / "causal.safetensors"))[0].embedder
        examples = []
        for r in rows:
            q = questions[r["id"]]
            doc = question_document(q, tokenizer)
            marked = sorted({u for g in answering_units(doc, q.spans()) for u in g}) if q.evidence else []
            units, qv = emb.units(doc.units), emb.query(q.question)
            hop = emb.query(hop_query(q.question, doc, units @ qv))
            s, x = passage_features(doc, units, qv, hop, q.question)
            examples.append(
                Example(None, None, marked or targets(r, None, "lasso", threshold), (s, masked(x, variant)))
            )
        head, rec = train(examples, HeadConfig())
        target = make_out_dir(cfg.out) / "passage-causal.safetensors"
        meta = {"labels": "marks, else causal", "variant": variant, "threshold": threshold, "model": cfg.model}
        meta.update(labelled=len(rows), train=rec, docs=cfg.docs, questions=cfg.questions, command=cfg.command)
        meta.update({k: shipped.get(k) for k in ("keep_auto", "keep_rule", "context")})
        save(head, target, meta, FEATURES)
    print(f"passage pruner: {target} ({time.perf_counter() - t0:.0f} s)")
    print(f"use it: masklab compress --router pruner-passage --router-file {target} --keep auto ...")
    return 0


def add_parser(sub) -> None:
    """The ``masklab train-router`` subcommand."""
    p = sub.add_parser(
        "train-router",
        help="train a router of each shipped kind (--kind evidence, pruner, pruner-ctx, pruner-passage) from the "
        "corpus or your documents",
        description=__doc__.splitlines()[0],
    )
    add_flags(p, TrainConfig)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args, TrainConfig())
    cfg = dataclasses.replace(
        cfg,
        command=getattr(args, "command_line", "masklab " + shlex.join(sys.argv[1:])),
        device=args.device,
        precision=args.precision,
    )
    return run(cfg)
