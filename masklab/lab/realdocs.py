"""``masklab realdocs``: the routers on the frozen real-document benchmark.

For each question of ``--split`` (:mod:`masklab.lab.tasks.realdocs`; ``val`` to choose, ``test``
to report) the document is cut into units (:func:`~masklab.text.document.segment`, the
answering model's tokenizer) and each router scores them once. The *answering units* are
the units that overlap an evidence string; per router and question:

* ``rank``: how many units, best first, until every answering unit is in (1 = the answer
  is the top unit); ``rr`` = 1 / rank (its mean is the MRR); ``latest_first`` (``latest``
  questions): the statement that holds now is ranked above every older one;
* at each ``--keep``: ``kept`` (every answering unit kept; for LongLLMLingua, which
  rewrites the text, every evidence string still in it verbatim), the kept fraction and,
  with ``--answers``, the answer from the kept text (``correct``: one of the question's
  answers in it) beside the answer from the whole document;
* ``router_seconds``: scoring (and for LongLLMLingua compressing) only.

``--routers`` also takes the framework anchors of :mod:`masklab.lab.anchors` (LangChain's
``EmbeddingsFilter``, ranked and kept like a router, with ``default``: what it returns at its
default ``k=20``; LlamaIndex's ``SentenceEmbeddingOptimizer``, kept like LongLLMLingua, with no
rank and its own kept fraction of tokens).

Rows per question go to ``OUT/rows.jsonl`` (resumable: a row names the benchmark's digest,
the model, the routers' weights and the code of this module, so rows made otherwise are not
reused); ``OUT/results.json`` holds the rows, the summary (Wilson intervals, paired
McNemar tests on kept / correct, paired sign-flip tests on reciprocal ranks, against
``bm25``) and ``OUT/results.md`` the table. Every run on the ``test`` split is appended to
``OUT/reads.jsonl``: how often the test split was read, and by which routers.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field

from masklab.util import device as devices
from masklab.lab.anchors import ANCHORS, LANGCHAIN, LLAMAINDEX
from masklab.lab.tasks.realdocs import answering_units
from masklab.pretrained.models import DEFAULT_MODEL
from masklab.util.files import append_jsonl, make_out_dir, read_jsonl
from masklab.util.flags import flag, float_list, str_list
from masklab.text.query import Query
from masklab.lab.routers.registry import prune_one

MEASURED = (
    "bm25",
    "lexical",
    "evidence",
    "attention",
    "bm25+evidence",
    "bm25+attention",
    "dense",
    "bm25+dense",
    "longllmlingua",
)
CONTROL = "bm25"
PAIRED = (
    "dense",
    "bm25+dense",
    "pruner",
    "pruner-attention",
    "pruner-ctx-attention",
    "pruner-ctx",
)  # further paired tests: embeddings, their hybrid, the pruners (the passage pruner against pruner-ctx)


@dataclass
class RealDocsConfig:
    model: str = flag(
        DEFAULT_MODEL,
        help="registered model (see `masklab models`) or a model directory: it "
        "answers, counts tokens and (for trained routers) routes",
    )
    router_model: str | None = flag(
        None,
        metavar="MODEL",
        default_text="--model's own router",
        help="the packaged model whose first layers and router rank the units for the "
        "trained routers (--model still answers and counts the tokens)",
    )
    split: str = flag(
        "val",
        choices=["val", "corpus-val", "test", "test2", "test3"],
        help="val or corpus-val (the "
        "training corpus's val documents: choose methods), test, test2 or test3 (report; test2 and test3 "
        "were written later, test3 mostly of evidence across units and passages; every run is logged "
        "in OUT/reads.jsonl)",
    )
    routers: list[str] = flag(
        factory=lambda: list(MEASURED[:8]),
        parse=str_list,
        default_text=",".join(MEASURED[:8]),
        help="comma-separated routers: the product's (`masklab compress --list-routers`; "
        "the default leaves out the pruner, which is measured by name), the lab's controls "
        "and references (masklab.lab.routers: attention, bm25+attention, pruner-attention, "
        "pruner-marks, oracle-gold, longllmlingua), and the framework anchors "
        f"{', '.join(ANCHORS)} (the anchors extra)",
    )
    embedder: str | None = flag(
        None,
        metavar="DIR",
        default_text="the packaged all-MiniLM-L6-v2",
        help="dense, bm25+dense and the anchors: a sentence-transformers model folder",
    )
    keep: list[float] = flag(
        factory=lambda: [0.1, 0.25], parse=float_list, above=0, max=1, help="kept fractions of the document's tokens"
    )
    kinds: list[str] = flag(
        factory=list,
        parse=str_list,
        default_text="every kind",
        help="comma-separated question kinds to measure (single, two, bridge, comparison, latest, multi)",
    )
    questions: int = flag(
        0,
        min=0,
        help="measure only this many questions (0: every one), taken in turn from each "
        "document of the split so every document is in (for slow routers such as longllmlingua)",
    )
    answers: bool = flag(False, help="also answer from the kept text and from the whole document (slow)")
    max_new_tokens: int = flag(24, min=1, help="longest answer in tokens (answers stop at their first sentence)")
    out: str = flag("runs/realdocs", metavar="DIR", help="output directory")
    threads: int = flag(1, min=1, help="torch threads")
    progress: bool = flag(True, help="a progress bar")
    command: str = field(default="", repr=False)
    device: str = "cpu"
    precision: str = "fp32"


def rank_of(scores, groups: list[list[int]]) -> int:
    """Units taken best first (ties: the earlier one) until every unit of ``groups`` is in."""
    import torch

    order = torch.argsort(scores, descending=True, stable=True).tolist()
    pos = {u: r for r, u in enumerate(order, 1)}
    return max(pos[u] for g in groups for u in g)


def _norm(s: str) -> str:
    return " ".join(s.split())


def evaluate_question(lm, q, routers: dict, keeps: list[float], answers: bool, max_new_tokens: int, docs: dict) -> dict:
    """One row: every router on question ``q`` (module docstring)."""
    from masklab.context.answer import generate_answer
    from masklab.lab.tasks.realdocs import question_document
    from masklab.context.routers.fused import Fused, fuse
    from masklab.lab.routers import REWRITERS
    from masklab.text.selection import select

    if q.doc not in docs:  # a multi question's units know their passage (the product stacks passages so)
        docs[q.doc] = question_document(q, lm.tokenizer)
    doc = docs[q.doc]
    gold = answering_units(doc, q.spans())
    stale = answering_units(doc, q.spans("stale")) if q.stale else []
    lengths = doc.lengths(lm.tokenizer)
    query = Query(q.question).text
    said: dict[str, dict] = {}

    def answer(text: str) -> dict:  # greedy answers are deterministic: one per distinct kept text
        if text not in said:
            said[text] = generate_answer(lm, [text], query, max_new_tokens, stop_at_sentence=True)
        return said[text]

    row = {
        "id": q.id,
        "doc": q.doc,
        "kind": q.kind,
        "units": len(doc.units),
        "tokens": sum(lengths),
        "lengths": lengths,
        "gold": gold,
        "stale": stale,
    }
    if answers:
        r = answer(q.text)
        row["full"] = {
            "answer": r["generated"],
            "correct": q.is_correct(r["generated"]),
            "seconds": r["seconds"],
            "prefill_seconds": r["prefill_seconds"],
        }
    computed: dict = {}  # name -> (scores, seconds): a fused router reuses its parts' scores
    for name, router in sorted(routers.items(), key=lambda kv: isinstance(kv[1], Fused)):
        rec: dict = {}
        if name in REWRITERS:  # rewrites the text: kept = every evidence string still in it
            rec["router_seconds"] = 0.0
            for k in keeps:
                p = prune_one(router, doc, q.question, k)
                rec["router_seconds"] += p.seconds
                text = _norm(p.text)
                cell = {"kept": all(_norm(e) in text for e in q.evidence), "kept_fraction": p.kept_fraction}
                if answers:
                    r = answer(p.text)
                    cell.update(
                        answer=r["generated"], correct=q.is_correct(r["generated"]), seconds=p.seconds + r["seconds"]
                    )
                rec[str(k)] = cell
            row[name] = rec
            continue
        if name == LLAMAINDEX:  # rewrites the text: the units found in it are the kept ones
            rec, texts = router.evaluate(doc, q.question, gold, lengths, keeps)
            if answers:
                for k in keeps:
                    r = answer(texts[k])
                    rec[str(k)].update(
                        answer=r["generated"],
                        correct=q.is_correct(r["generated"]),
                        seconds=rec["router_seconds"] / len(keeps) + r["seconds"],
                    )
            row[name] = rec
            continue
        part = getattr(router, "other", None)
        if (
            isinstance(router, Fused)
            and "bm25" in computed
            and part.name in computed
            and part.meta == getattr(routers[part.name], "meta", None)
        ):  # the same second router: scores reused
            (b, tb), (t, tt) = computed["bm25"], computed[part.name]
            scores, rec["router_seconds"] = fuse(b, t, router.how, router.weight), tb + tt
        else:
            t0 = time.perf_counter()
            scores = router.checked(doc, router.read_hops(doc, [q.question]).values[0])  # with its second hop
            rec["router_seconds"] = time.perf_counter() - t0
        computed[name] = (scores, rec["router_seconds"])
        if isinstance(router, Fused):
            rec["fusion"] = [router.how, router.weight]
        rec["rank"] = rank_of(scores, gold)
        rec["rr"] = 1 / rec["rank"]
        if stale:
            best_stale = min(rank_of(scores, [g]) for g in stale)
            rec["latest_first"] = rank_of(scores, gold) < best_stale
        rec["scores"] = [round(float(s), 5) for s in scores]
        if name == LANGCHAIN:
            rec["default"] = router.default(doc, q.question, gold, lengths)
        for k in keeps:
            kept = set(select(scores, lengths, k, fill=True, context=router.neighbours))
            cell = {
                "kept": all(u in kept for g in gold for u in g),
                "kept_fraction": sum(lengths[i] for i in kept) / sum(lengths),
            }
            if answers:
                r = answer(doc.text_of(sorted(kept)))
                cell.update(
                    answer=r["generated"],
                    correct=q.is_correct(r["generated"]),
                    seconds=rec["router_seconds"] + r["seconds"],
                )
            rec[str(k)] = cell
        row[name] = rec
    return row


def sign_flip_p(a: list[float], b: list[float], resamples: int = 20000, seed: int = 0) -> float:
    """Two-sided paired permutation (sign-flip) test of mean(a - b) = 0."""
    import numpy as np

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if not d.any():
        return 1.0
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], size=(resamples, len(d)))
    null = np.abs((signs * d).mean(1))
    return float((1 + (null >= abs(d.mean()) - 1e-12).sum()) / (resamples + 1))


def pct(keep: float) -> str:
    """A keep as the percent in metric names: 0.1 -> ``10`` (``kept@10``, ``acc@10``)."""
    return f"{round(keep * 100):d}"


def summarise(rows: list[dict], names: list[str], keeps: list[float]) -> list[dict]:
    """One row per (question group ``task``: all, single, two+latest (every kind but single),
    multi-unit (:data:`~masklab.lab.tasks.realdocs.MULTI_UNIT`), and each kind; router
    ``method``): n, MRR, recall@1/@3, latest_first, kept and
    correct at each keep, with Wilson intervals and paired tests against :data:`CONTROL` (and,
    where they were measured beside, against each router of :data:`PAIRED`)."""
    from masklab.lab.stats import mcnemar, wilson

    from masklab.lab.tasks.realdocs import KINDS, MULTI_UNIT

    groups = {
        "all": rows,
        "two+latest": [r for r in rows if r["kind"] != "single"],
        "multi-unit": [r for r in rows if r["kind"] in MULTI_UNIT],
        **{k: [r for r in rows if r["kind"] == k] for k in KINDS},
    }
    out = []
    for g, cell in groups.items():
        if not cell:
            continue
        if "full" in cell[0]:
            k = sum(r["full"]["correct"] for r in cell)
            lo, hi = wilson(k, len(cell))
            out.append({"task": g, "method": "full", "n": len(cell), "acc": k / len(cell), "acc_lo": lo, "acc_hi": hi})
        for m in names:
            s: dict = {
                "task": g,
                "method": m,
                "n": len(cell),
                "router_seconds": sum(r[m]["router_seconds"] for r in cell) / len(cell),
            }
            if "rr" in cell[0][m]:
                s["mrr"] = sum(r[m]["rr"] for r in cell) / len(cell)
                for at in (1, 3):
                    k = sum(r[m]["rank"] <= at for r in cell)
                    s[f"r@{at}"] = k / len(cell)
                    s[f"r@{at}_lo"], s[f"r@{at}_hi"] = wilson(k, len(cell))
                if "default" in cell[0][m]:  # LangChain's EmbeddingsFilter at its default k
                    k = sum(r[m]["default"]["kept"] for r in cell)
                    lo, hi = wilson(k, len(cell))
                    s.update(
                        {
                            "default_k": cell[0][m]["default"]["k"],
                            "default_kept": k / len(cell),
                            "default_kept_lo": lo,
                            "default_kept_hi": hi,
                            "default_units": sum(r[m]["default"]["units"] for r in cell) / len(cell),
                            "default_fraction": sum(r[m]["default"]["kept_fraction"] for r in cell) / len(cell),
                        }
                    )
                lat = [r for r in cell if "latest_first" in r[m]]
                if lat:
                    k = sum(r[m]["latest_first"] for r in lat)
                    s.update(latest_first=k / len(lat), latest_n=len(lat))
                if m != CONTROL and CONTROL in cell[0]:
                    s["p_mrr_vs_bm25"] = sign_flip_p([r[m]["rr"] for r in cell], [r[CONTROL]["rr"] for r in cell])
                    if lat:
                        s["p_latest_vs_bm25"] = mcnemar(
                            [r[m]["latest_first"] for r in lat], [r[CONTROL]["latest_first"] for r in lat]
                        )
            for kp in keeps:
                key, tag = str(kp), pct(kp)
                k = sum(r[m][key]["kept"] for r in cell)
                lo, hi = wilson(k, len(cell))
                s.update(
                    {
                        f"kept@{tag}": k / len(cell),
                        f"kept@{tag}_lo": lo,
                        f"kept@{tag}_hi": hi,
                        f"fraction@{tag}": sum(r[m][key]["kept_fraction"] for r in cell) / len(cell),
                    }
                )
                if m != CONTROL and CONTROL in cell[0]:
                    s[f"p_kept@{tag}_vs_bm25"] = mcnemar(
                        [r[m][key]["kept"] for r in cell], [r[CONTROL][key]["kept"] for r in cell]
                    )
                if "correct" in cell[0][m][key]:
                    k = sum(r[m][key]["correct"] for r in cell)
                    lo, hi = wilson(k, len(cell))
                    s.update(
                        {
                            f"acc@{tag}": k / len(cell),
                            f"acc@{tag}_lo": lo,
                            f"acc@{tag}_hi": hi,
                            f"p_acc@{tag}_vs_full": mcnemar(
                                [r[m][key]["correct"] for r in cell], [r["full"]["correct"] for r in cell]
                            ),
                        }
                    )
                    if m != CONTROL and CONTROL in cell[0]:
                        s[f"p_acc@{tag}_vs_bm25"] = mcnemar(
                            [r[m][key]["correct"] for r in cell], [r[CONTROL][key]["correct"] for r in cell]
                        )
            for other in PAIRED:  # the further controls, where measured beside
                if m == other or other not in cell[0] or "rr" not in cell[0][m] or "rr" not in cell[0][other]:
                    continue
                s[f"p_mrr_vs_{other}"] = sign_flip_p([r[m]["rr"] for r in cell], [r[other]["rr"] for r in cell])
                for kp in keeps:
                    s[f"p_kept@{pct(kp)}_vs_{other}"] = mcnemar(
                        [r[m][str(kp)]["kept"] for r in cell], [r[other][str(kp)]["kept"] for r in cell]
                    )
            out.append(s)
    return out


def _fmt(s: dict, key: str) -> str:
    if key not in s:
        return "-"
    lo, hi = s.get(f"{key}_lo"), s.get(f"{key}_hi")
    return f"{s[key]:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None else "")


def markdown(res: dict) -> str:
    keeps = [pct(k) for k in res["config"]["keep"]]
    head = ["questions", "router", "n", "MRR", "recall@1", "latest first"] + [f"kept@{k}%" for k in keeps]
    if res["config"]["answers"]:
        head += [f"acc@{k}%" for k in keeps] + ["acc (full)"]
    lines = [
        f"# Routers on the real-document benchmark ({res['split']}, {res['model']}, benchmark {res['benchmark']})",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    full = {s["task"]: s for s in res["summary"] if s["method"] == "full"}
    for s in res["summary"]:
        if s["method"] == "full":
            continue
        cells = [
            s["task"],
            s["method"],
            str(s["n"]),
            f"{s['mrr']:.3f}" if "mrr" in s else "-",
            _fmt(s, "r@1"),
            f"{s['latest_first']:.2f}" if "latest_first" in s else "-",
        ] + [_kept_cell(s, k) for k in keeps]
        if res["config"]["answers"]:
            cells += [_fmt(s, f"acc@{k}") for k in keeps] + [_fmt(full.get(s["task"], {}), "acc")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        f"\n{s['method']} at its default k={s['default_k']} ({s['task']}): every answering unit among what it "
        f"returns for {_fmt(s, 'default_kept')} of questions; it returns {s['default_units']:.1f} units, "
        f"{s['default_fraction']:.2f} of the tokens"
        for s in res["summary"]
        if "default_kept" in s and s["task"] == "all"
    ]
    return "\n".join(lines)


def _kept_cell(s: dict, tag: str) -> str:
    """``kept@tag`` with the kept fraction of tokens beside it where that is off the asked one
    by more than a quarter (LlamaIndex's optimizer keeps a share of sentences and their
    neighbours, not of tokens)."""
    cell, frac = _fmt(s, f"kept@{tag}"), s.get(f"fraction@{tag}")
    if frac is not None and abs(frac - int(tag) / 100) > 0.25 * int(tag) / 100:
        cell += f" ({frac:.2f} of tokens)"
    return cell


def shipped_digest(model: str) -> str | None:
    """12 hex digits of sha256 over the weights shipped for ``model`` (None where none ship):
    what names those routers in a run's settings, so shipping new weights redoes the runs."""
    from masklab.context.routers.trained import shipped
    from masklab.pretrained.models import MODELS

    path = shipped(model).with_suffix(".safetensors")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if model in MODELS and path.is_file() else None


def pruners_digest() -> str:
    """12 hex digits of sha256 over the shipped pruners' weights: what names them in a run's
    settings, so shipping new weights redoes the runs."""
    from masklab.context.routers.pruner import WEIGHTS

    h = hashlib.sha256()
    for path in sorted(WEIGHTS.glob("*.safetensors")):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def weights_digest(name: str, routers: list[str]) -> str:
    """What names the routers' weights: the digest of the trained routers shipped for model
    ``name`` and, where a pruner is measured, ``+pruner-`` the shipped pruners' (or none)."""
    from masklab.lab.routers import names, takes

    known = [n for n in routers if n in names()]  # (an anchor is no router)
    parts = [shipped_digest(name) or "none"] if any(takes(n, "router_model") for n in known) else []
    if any(takes(n, "score_range") for n in known):
        parts.append(f"pruner-{pruners_digest()}")
    return "+".join(parts) or "none"


def _stamp_of(row: dict) -> dict:
    """A row's stamp (rows made before ``--router-model`` were ranked by their own model)."""
    st = row.get("stamp", {})
    return {"router_model": st.get("model"), **st}


def in_turn(questions: list) -> list:
    """The questions reordered as the first of each document, then the second of each, ..."""
    by_doc: dict[str, list] = {}
    for q in questions:
        by_doc.setdefault(q.doc, []).append(q)
    depth = max(len(v) for v in by_doc.values())
    return [v[i] for i in range(depth) for v in by_doc.values() if i < len(v)]


def run(cfg: RealDocsConfig) -> int:
    from masklab.lab import anchors
    from masklab.context.embedder import check_folder
    from masklab.lab.routers import check, load_any, takes
    from masklab.util.files import write_json
    from masklab.util.flags import check_ranges
    from masklab.pretrained.models import check_models, load
    from masklab.lab.revision import code_ast, code_hash
    from masklab.lab.tasks import realdocs

    check_ranges(cfg)
    if cfg.embedder:
        check_folder(cfg.embedder)
    for name in cfg.routers:
        if name not in ANCHORS:
            check(name)  # an unknown name: one clear error before the model loads
    anchors.check(cfg.routers)  # an anchor without its extra: one clear error before the model loads
    dev = devices.resolve(cfg.device)
    check_models([cfg.model] + ([cfg.router_model] if cfg.router_model else []))
    questions = realdocs.load(cfg.split)
    if cfg.kinds:
        questions = [q for q in questions if q.kind in cfg.kinds]
    if cfg.questions:
        questions = in_turn(questions)[: cfg.questions]
    out = make_out_dir(cfg.out)
    lm = load(cfg.model, threads=cfg.threads, device=dev)
    given = {"embedder": cfg.embedder, "router_model": cfg.router_model}  # for the routers that take them
    routers = {
        n: anchors.load_anchor(n, lm, cfg.embedder)
        if n in ANCHORS
        else load_any(n, lm, **{k: v for k, v in given.items() if takes(n, k)})
        for n in cfg.routers
    }
    stamp = {
        "benchmark": realdocs.benchmark_digest(cfg.split),
        "model": lm.name,
        "router_model": cfg.router_model or lm.name,
        "embedder": cfg.embedder,
        "weights": weights_digest(cfg.router_model or lm.name, cfg.routers),
        "answers": cfg.answers,
        "keep": cfg.keep,
        "max_new_tokens": cfg.max_new_tokens,
    }
    code = {"code": code_hash("masklab.lab.realdocs"), "code_ast": code_ast("masklab.lab.realdocs")}
    # recorded per row, taken at the start (`masklab report --stale` reads them); resume keys on the stamp
    path = out / f"rows_{cfg.split}.jsonl"
    done = {
        r["id"]: r
        for r in read_jsonl(path)
        if {k: _stamp_of(r).get(k) for k in stamp} == stamp and all(n in r for n in cfg.routers)
    }
    todo = [q for q in questions if q.id not in done]
    if cfg.split.startswith("test") and todo:  # a new measurement on a test split, not a re-summary
        append_jsonl(
            out / "reads.jsonl",
            {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "split": cfg.split,
                "model": lm.name,
                "routers": cfg.routers,
                "weights": stamp["weights"],
                "benchmark": stamp["benchmark"],
                "answers": cfg.answers,
                "questions": len(todo),
            },
        )
    docs: dict = {}
    it = todo
    if cfg.progress and todo:
        from tqdm import tqdm

        it = tqdm(todo, desc=f"realdocs {cfg.split} {lm.name}", file=sys.stderr)
    t0, c0 = time.perf_counter(), time.process_time()
    with devices.autocast(dev, cfg.precision):
        for q in it:
            row = evaluate_question(lm, q, routers, cfg.keep, cfg.answers, cfg.max_new_tokens, docs)
            row["stamp"] = {**stamp, **code}
            append_jsonl(path, row)
            done[q.id] = row
    rows = [done[q.id] for q in questions]
    reads = sum(r.get("split", "test") == cfg.split for r in read_jsonl(out / "reads.jsonl"))
    res = {
        "command": cfg.command,
        "model": lm.name,
        "router_model": stamp["router_model"],
        "split": cfg.split,
        "benchmark": stamp["benchmark"],
        "weights": stamp["weights"],
        "code": sorted({r["stamp"]["code"] for r in rows}),
        "questions": {
            "n": len(rows),
            "documents": len({r["doc"] for r in rows}),
            **{k: sum(r["kind"] == k for r in rows) for k in realdocs.KINDS},
        },
        "config": asdict(cfg),
        "test_reads": reads,
        "device": devices.describe(lm.model.device, cfg.precision),
        "seconds": {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0},
        "summary": summarise(rows, cfg.routers, cfg.keep),
        "rows": rows,
    }
    previous = out / f"results_{cfg.split}.json"
    if not todo and previous.is_file():  # a re-summary: the seconds stay those of the run that measured
        res["seconds"] = json.loads(previous.read_text()).get("seconds", res["seconds"])
    write_json(out / f"results_{cfg.split}.json", res)
    (out / f"results_{cfg.split}.md").write_text(markdown(res) + "\n")
    print(markdown(res))
    return 0


def add_parser(sub) -> None:
    from masklab.util.flags import add_flags

    p = sub.add_parser(
        "realdocs", help="measure routers on the frozen real-document benchmark", description=__doc__.splitlines()[0]
    )
    add_flags(p, RealDocsConfig)
    p.set_defaults(handler=main)


def main(args) -> int:
    import dataclasses
    import shlex

    from masklab.util.flags import config_from_args

    cfg = config_from_args(args, RealDocsConfig())
    cfg = dataclasses.replace(
        cfg, command="masklab " + shlex.join(sys.argv[1:]), device=args.device, precision=args.precision
    )
    return run(cfg)


CANDIDATES = (
    [("z", w) for w in (0.25, 0.5, 1.0, 2.0)]
    + [("rrf", w) for w in (0.5, 1.0, 2.0)]
    + [("rerank", k) for k in (3, 5, 10)]
)


def fusion_grid(runs: dict[str, list[dict]], other: str = "evidence", keep: float = 0.1) -> list[dict]:
    """Every candidate fusion (:data:`CANDIDATES`) of ``bm25`` and the router ``other``
    recomputed from the stored scores of val ``runs`` (model -> rows): per model and pooled,
    MRR and the share of questions whose answering units are kept at ``keep``; ``bm25`` and
    ``other`` alone beside them."""
    import torch

    from masklab.context.routers.fused import fuse
    from masklab.text.selection import select

    def measure(rows, how, w):
        rr, kept = [], []
        for r in rows:
            b, t = torch.tensor(r["bm25"]["scores"]), torch.tensor(r[other]["scores"])
            s = b if how == "bm25" else t if how == other else fuse(b, t, how, w)
            rr.append(1 / rank_of(s, r["gold"]))
            k = set(select(s, r["lengths"], keep))
            kept.append(all(u in k for g in r["gold"] for u in g))
        return rr, kept

    out = []
    for how, w in [("bm25", 0.0), (other, 0.0), *CANDIDATES]:
        row = {"how": how, "weight": w}
        rr_all, kept_all = [], []
        for model, rows in runs.items():
            rr, kept = measure(rows, how, w)
            row[f"mrr_{model}"], row[f"kept_{model}"] = sum(rr) / len(rr), sum(kept) / len(kept)
            rr_all += rr
            kept_all += kept
        row["mrr"], row["kept"] = sum(rr_all) / len(rr_all), sum(kept_all) / len(kept_all)
        out.append(row)
    return out


def choose(grid: list[dict], floor: tuple[str, ...] = ("bm25",)) -> dict:
    """The rule fixed before the val results it chooses on were read: the candidate fusion with the best
    pooled MRR among those whose pooled kept share is no lower than that of any router in ``floor``
    alone (``bm25`` for ``bm25+evidence``; ``bm25`` and ``dense`` for ``bm25+dense``); ties: the
    earlier candidate, the smaller weight. None qualifies: the router of ``floor`` with the best MRR."""
    alone = [r for r in grid if r["how"] in floor]
    ok = [r for r in grid if r["how"] in ("z", "rrf", "rerank") and r["kept"] >= max(a["kept"] for a in alone)]
    return max(ok or alone, key=lambda r: r["mrr"])
