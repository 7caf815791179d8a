"""Training the passage pruner's head (``pruner-passage``, :mod:`masklab.context.passage`) and choosing it
on val: what ``scripts/train_passage.py`` runs.

The head is ``pruner-ctx``'s (:class:`~masklab.context.contextual.ContextHead`: a residual on the shipped
pruner's cosine, then a calibration) reading :data:`~masklab.context.passage.FEATURES`: each unit's
neighbourhood, its paragraph's and section's (or passage's) scores by embedding and by BM25, and a second
hop. Targets (``labels``): the causal ``union`` labels of ``pruner-ctx`` (the keep-set labels of every labelled
training question of the corpus, with the round-5 random-ablation set where a question has one), or the writers'
marks of the same questions, so each comparison changes one thing. Variants, everything else equal:

* ``two-hop``: every feature;
* ``one-hop``: the hop's features zeroed (the same head without a second hop): one hop vs two;
* ``unit``: the passage and hop features zeroed: ``pruner-ctx``'s features retrained on these targets (the
  control that isolates the passage level from the new training questions);

beside the shipped ``pruner-ctx`` and the round-5 ``pruner``, on the corpus's val documents (every kind,
``multi`` questions over 5-10 passages of different documents included), with the writers' marks as truth:
MRR (the rank at which all evidence is in), all evidence kept at 0.1 and 0.25 of the tokens (with the best
unit's neighbours, each variant's number chosen on val), and for ``multi`` questions whose evidence lies in
two passages, both passages among the top two (passages ranked by their best unit). Paired tests against
the shipped ``pruner-ctx``: sign flips on MRR, McNemar on kept.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from masklab.context.passage import FEATURES, VARIANTS, hop_query, masked, passage_features, together
from masklab.util.errors import MasklabError

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("single", "two", "bridge", "comparison", "latest", "multi")


def labelled(model: str) -> dict[str, list[int]]:
    """The ``union`` target units (document unit indices) of every labelled training question, by key."""
    from masklab.lab.labels import keepset_target
    from masklab.lab.train_ctx import CORPUS_LABELS, KEEPSET_GAIN
    from masklab.lab.train_pruner import shipped_recipe, target_set
    from masklab.util.files import read_jsonl

    threshold = shipped_recipe()["threshold"]
    out: dict[str, set[int]] = {}
    for f in sorted(CORPUS_LABELS.glob(f"labels-{model}-train*.jsonl")):
        for r in read_jsonl(f):
            out.setdefault(r["key"], set()).update(r["window"][i] for i in target_set(r, "causal", threshold))
    for f in sorted(CORPUS_LABELS.glob(f"labels-keepset-{model}-train*.jsonl")):
        for r in read_jsonl(f):
            out.setdefault(r["key"], set()).update(r["window"][i] for i in keepset_target(r, KEEPSET_GAIN))
    if not out:
        raise MasklabError(f"no corpus labels for {model} in {CORPUS_LABELS} (scripts/label_corpus.py makes them)")
    return {k: sorted(v) for k, v in out.items()}


def features_of(questions: list, docs: dict, emb) -> dict:
    """Each question's ``(s, x)`` (:func:`~masklab.context.passage.passage_features`), by id. Every distinct
    unit is embedded once (a ``multi`` question's passages repeat its documents' units)."""
    from tqdm import tqdm

    texts = sorted({u for q in questions for u in docs[q.id].units})
    table = {}
    for i in tqdm(range(0, len(texts), 512), desc="units", file=sys.stderr, mininterval=10):
        table.update(zip(texts[i : i + 512], emb.encode(texts[i : i + 512])))
    units = {q.id: torch.stack([table[u] for u in docs[q.id].units]) for q in questions}
    q_vec = emb.encode([q.question for q in questions])
    hops = emb.encode([hop_query(q.question, docs[q.id], units[q.id] @ v) for q, v in zip(questions, q_vec)])
    return {
        q.id: passage_features(docs[q.id], units[q.id], v, h, q.question)
        for q, v, h in tqdm(list(zip(questions, q_vec, hops)), desc="features", file=sys.stderr, mininterval=10)
    }


def cached_features(path: Path, questions: list, docs: dict, emb) -> dict:
    """:func:`features_of`, kept in ``path`` (safetensors) and read back by a later run of the same features
    over the same questions (a run killed after them resumes there)."""
    from safetensors.torch import load_file, save_file

    from masklab.lab.revision import code_hash

    stamp = {"code": code_hash("masklab.context.passage"), "ids": ",".join(q.id for q in questions)}
    if path.is_file():
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            same = f.metadata() == stamp
        if same:
            flat = load_file(str(path))
            return {q.id: (flat[f"{q.id}/s"], flat[f"{q.id}/x"]) for q in questions}
    feats = features_of(questions, docs, emb)
    path.parent.mkdir(parents=True, exist_ok=True)
    flat = {f"{i}/{k}": t.contiguous() for i, (s, x) in feats.items() for k, t in (("s", s), ("x", x))}
    save_file(flat, str(path), metadata=stamp)
    return feats


def passage_recall(row: dict) -> bool | None:
    """Both evidence passages among the top two by their best unit (None unless the evidence lies in two)."""
    if row["passage_of"] is None:
        return None
    ev = sorted({row["passage_of"][u] for g in row["gold"] for u in g})
    if len(ev) != 2:
        return None
    s = torch.tensor(row["scores"])
    best = {}
    for u, p in enumerate(row["passage_of"]):
        best[p] = max(best.get(p, -1e9), float(s[u]))
    top = sorted(best, key=lambda p: (-best[p], p))[:2]
    return set(ev) <= set(top)


def run(model: str, out: Path, command: str, epochs: int, ship: str | None = None, labels: str = "union") -> dict:
    """Every variant of :data:`VARIANTS` trained on the same questions and targets and measured on the
    corpus's val questions beside the shipped ``pruner-ctx`` (module docstring): ``out/results.json`` and
    ``out/passage-VARIANT.safetensors``; ``ship``: that variant also into the package's weights. ``labels``:
    ``union`` (the causal labels) or ``marks`` (the writers' evidence units of the same questions)."""
    from masklab.context.contextual import probabilities
    from masklab.context.routers.pruner import WEIGHTS, cached_pruner
    from masklab.context.routers.pruner import _load_head as shipped_head
    from masklab.lab.realdocs import answering_units
    from masklab.lab.revision import code_hash
    from masklab.lab.tasks import realdocs
    from masklab.lab.train_ctx import GRIDS, Example, HeadConfig, choose_context, keep_rules, save, train
    from masklab.text.selection import KEEP_RULES
    from masklab.lab.labels import question_key
    from masklab.pretrained.models import load
    from masklab.util.files import write_json

    t_all, c_all = time.perf_counter(), time.process_time()
    tok = load(model).tokenizer
    targets = labelled(model)
    train_qs = [q for q in realdocs.load("train", realdocs.CORPUS) if question_key(q) in targets]
    val = realdocs.load("val", realdocs.CORPUS)
    docs = {q.id: realdocs.question_document(q, tok) for q in train_qs + val}
    pruner = cached_pruner(str(WEIGHTS / "causal.safetensors"))[0]
    emb = pruner.embedder
    t0 = time.perf_counter()
    feats = cached_features(out / "features.safetensors", train_qs + val, docs, emb)
    feature_s = time.perf_counter() - t0
    print(f"{len(train_qs)} training questions, {len(val)} val; features in {feature_s:.0f} s", file=sys.stderr)

    def rows_of(score) -> list[dict]:
        rows = []
        for q in val:
            doc = docs[q.id]
            rows.append(
                {
                    "id": q.id,
                    "kind": q.kind,
                    "scores": [round(float(x), 4) for x in score(q)],
                    "lengths": doc.lengths(tok),
                    "gold": answering_units(doc, q.spans()),
                    "passage_of": doc.passage_of,
                }
            )
        return rows

    ctx_head = shipped_head(str(WEIGHTS / "ctx-union.safetensors"))[0]
    methods = {
        "pruner-ctx": rows_of(lambda q: probabilities(ctx_head, emb.units(docs[q.id].units), emb.query(q.question))),
        "pruner": rows_of(lambda q: feats[q.id][0]),
    }
    cfg, heads, records = HeadConfig(epochs=epochs), {}, {}
    if labels == "marks":
        targets = {
            question_key(q): sorted({u for g in answering_units(docs[q.id], q.spans()) for u in g}) for q in train_qs
        }
    elif labels != "union":
        raise MasklabError(f"unknown labels {labels!r}; choose from union, marks")
    for name in VARIANTS:
        ex = [
            Example(None, None, targets[question_key(q)], (feats[q.id][0], masked(feats[q.id][1], name)))
            for q in train_qs
            if targets[question_key(q)]
        ]
        head, records[name] = train(ex, cfg)
        heads[name] = head
        with torch.no_grad():
            methods[name] = rows_of(
                lambda q: together(docs[q.id], torch.sigmoid(head(feats[q.id][0], masked(feats[q.id][1], name))))
            )
        print(name, records[name]["examples"], "examples", file=sys.stderr)

    res = {
        "command": command,
        "model": model,
        "labels": labels,
        "code": code_hash("masklab.lab.train_passage"),
        "config": cfg.__dict__,
        "features": list(FEATURES),
        "train_questions": len(train_qs),
        "train_kinds": {k: sum(q.kind == k for q in train_qs) for k in KINDS},
        "val_questions": len(val),
        "val_kinds": {k: sum(q.kind == k for q in val) for k in KINDS},
        "corpus": realdocs.digest(realdocs.CORPUS),
        "feature_seconds": feature_s,
        "train": records,
    }
    base = methods["pruner-ctx"]
    res["context"] = {name: choose_context(rows)["context"] for name, rows in methods.items()}
    res["summary"] = summarise(methods, res["context"])
    res["rows"] = {name: [{"id": r["id"], "scores": r["scores"]} for r in rows] for name, rows in methods.items()}
    res["val_rows"] = [
        {"id": r["id"], "kind": r["kind"], "lengths": r["lengths"], "gold": r["gold"], "passage_of": r["passage_of"]}
        for r in base
    ]
    res["keep_auto"] = {}
    grids = {**GRIDS, "threshold": [i / 100 for i in range(1, 100)]}
    for name in heads:  # --keep auto's rule, chosen on val as pruner-ctx's was (train_ctx.keep_rules)
        at = next(r for r in res["summary"] if r["task"] == "all" and r["method"] == name)
        rules = keep_rules(methods[name], at["kept@25"], res["context"][name], grids)
        res["keep_auto"][name] = {
            "rules": rules,
            "chosen": min((r for r in rules if r["rule"] in KEEP_RULES), key=lambda r: r["fraction"], default=None),
        }
    res["seconds"] = {"wall": time.perf_counter() - t_all, "cpu": time.process_time() - c_all}
    write_json(out / "results.json", res)
    for name, head in heads.items():
        auto = res["keep_auto"][name]["chosen"] or {}
        meta = {"labels": labels, "variant": name, "model": model, "context": res["context"][name]}
        meta.update(keep_auto=auto.get("param"), keep_rule=auto.get("rule"))
        meta.update(command=command, code=res["code"], train=records[name])
        save(head, out / f"passage-{name}.safetensors", meta, FEATURES)
        if name == ship:  # the head pruner-passage reads
            save(head, WEIGHTS / "passage.safetensors", meta, FEATURES)
    return res


TASKS = {  # the val cells: every question, the multi-unit kinds, bridges with multi-passage questions, each kind
    "all": KINDS,
    "multi-unit": KINDS[1:],
    "bridge+multi": ("bridge", "multi"),
    **{k: (k,) for k in KINDS},
}


def summarise(methods: dict[str, list[dict]], context: dict[str, int]) -> list[dict]:
    """One row per cell of :data:`TASKS` and method (MRR, all evidence kept at 0.1 and 0.25 with Wilson
    intervals, both evidence passages in the top two), paired tests against ``pruner-ctx`` (sign flips on
    MRR, McNemar on kept), and the two hops against one, from the per-question rows (``rows``: each
    question's ``kind``, ``scores``, ``lengths``, ``gold`` and ``passage_of``)."""
    from masklab.lab.realdocs import rank_of, sign_flip_p
    from masklab.lab.stats import mcnemar, wilson
    from masklab.lab.train_ctx import kept_at

    def rrs(rows: list[dict]) -> list[float]:
        return [1 / rank_of(torch.tensor(r["scores"]), r["gold"]) for r in rows]

    out, base = [], methods["pruner-ctx"]
    for task, kinds in TASKS.items():
        idx = [i for i, r in enumerate(base) if r["kind"] in kinds]
        if not idx:
            continue
        for name, rows in methods.items():
            sub, bsub, ctx = [rows[i] for i in idx], [base[i] for i in idx], context[name]
            rr = rrs(sub)
            row = {"task": task, "method": name, "n": len(sub), "mrr": sum(rr) / len(sub), "context": ctx}
            for keep in (0.1, 0.25):
                key = f"kept@{round(keep * 100)}"
                kept = kept_at(sub, keep, ctx)
                row[key] = sum(kept) / len(sub)
                row[f"{key}_lo"], row[f"{key}_hi"] = wilson(sum(kept), len(sub))
                if name != "pruner-ctx":
                    row[f"p_{key}_vs_ctx"] = mcnemar(kept, kept_at(bsub, keep, context["pruner-ctx"]))
            recall = [x for x in map(passage_recall, sub) if x is not None]
            if recall:
                row["passages@2"], row["passages@2_n"] = sum(recall) / len(recall), len(recall)
                row["passages@2_lo"], row["passages@2_hi"] = wilson(sum(recall), len(recall))
                if name != "pruner-ctx":
                    brec = [x for x in map(passage_recall, bsub) if x is not None]
                    row["p_passages@2_vs_ctx"] = mcnemar(recall, brec)
            if name != "pruner-ctx":
                row["p_mrr_vs_ctx"] = sign_flip_p(rr, rrs(bsub))
            out.append(row)
        if "two-hop" in methods and "one-hop" in methods:
            a, b = [methods["two-hop"][i] for i in idx], [methods["one-hop"][i] for i in idx]
            hop = {"task": task, "method": "two-vs-one-hop", "n": len(idx), "p_mrr": sign_flip_p(rrs(a), rrs(b))}
            for keep in (0.1, 0.25):
                key = f"kept@{round(keep * 100)}"
                hop[f"p_{key}"] = mcnemar(kept_at(a, keep, context["two-hop"]), kept_at(b, keep, context["one-hop"]))
            out.append(hop)
    return out


def summary_table(res: dict) -> str:
    keys = ("mrr", "kept@10", "kept@25", "passages@2")
    lines = []
    for r in res["summary"]:
        if "mrr" in r:
            lines.append(
                f"{r['task']:10} {r['method']:11} n={r['n']:4} "
                + " ".join(f"{k}={r[k]:.3f}" for k in keys if k in r)
                + " "
                + " ".join(f"{k}={r[k]:.3g}" for k in r if k.startswith("p_"))
            )
    return "\n".join(lines)
