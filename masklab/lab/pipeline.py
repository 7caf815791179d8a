"""The one evaluation loop for answering from a pruned context, and its one set of measures.

``masklab longctx``, ``masklab prune`` and ``masklab train-router --eval`` run their examples
through :func:`evaluate`: each example is answered by every *method* (the full context, a
router's kept units, a kvpress press), interleaved so machine noise hits all methods alike
(example ``i`` runs the method list rotated by ``i``); each finished example is appended to a
JSON-lines log, and a killed run continues after the last logged example with the same
numbers.

An *example* is a :class:`~masklab.text.document.Document` (``units``, ``gold``: the indices of
the answering units) with a ``query`` text (:class:`~masklab.text.query.Query`), a ``question``
(what the routers read) and ``is_correct(answer) -> bool`` (an
:class:`~masklab.lab.tasks.base.Example`, or a ``FamilyExample``, which builds its query):
:class:`~masklab.lab.tasks.longctx.LongExample`, :class:`~masklab.lab.tasks.families.FamilyExample`,
:class:`~masklab.lab.tasks.stale_prompts.StalePrompt`, :class:`~masklab.lab.tasks.squad.SquadItem`.

A *method* is a name and a *step*: ``step(example) -> (row, answer)``. The steps here
(:func:`full`, :func:`routed`, :func:`pressed`) answer greedily and fill a row with the
measures, each defined once:

* ``acc`` - 1.0 when ``example.is_correct(answer)``, else 0.0;
* ``kept`` - the kept fraction of the context's tokens (:attr:`Pruned.kept_fraction`; a
  press: the fraction of key/value pairs it is set to keep; ``cache_tokens``: the context
  positions it left in the cache, measured);
* ``gold_kept`` - the share of the gold units kept (a compressor that rewrites the text: the
  share of gold units found in its text verbatim);
* ``gold_top`` - 1.0 when the router's ``len(gold)`` best-scored units are exactly the gold
  units, else 0.0;
* ``seconds`` - router + tokenise + prefill + decode; ``prefill_s`` - tokenise + prefill;
  ``router_s`` - the router's own seconds, and ``router_share`` their share of the same
  example's full-context prefill (when ``full`` is among the methods);
* ``kv_mb`` - the KV cache after the answer, by formula (:func:`kv_cache_mb`).
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from masklab.context.answer import generate_answer
from masklab.context.router import Pruned
from masklab.util.files import append_jsonl, read_jsonl
from masklab.text.query import Query

Step = Callable[[object], tuple[dict, str]]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (monotone over a run)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024


def kv_cache_mb(lm, tokens: float) -> float:
    """KV-cache size by formula for ``tokens`` cached positions: layers x 2 (K, V) x KV heads
    x head dim x tokens x bytes per value, in MiB (every layer full length: Gemma 3's
    sliding-window layers would cap theirs at the window)."""
    from masklab.pretrained.arch import kv_heads as kv_heads_of

    c = lm.model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = kv_heads_of(lm.model)
    size = next(lm.model.parameters()).element_size()
    return c.num_hidden_layers * 2 * kv_heads * head_dim * tokens * size / 2**20


def gold_kept(example, pruned: Pruned) -> float:
    """The share of ``example.gold`` that ``pruned`` kept (module docstring)."""
    if pruned.compressed is not None:  # rewritten text: a gold unit counts where it is there verbatim
        return sum(example.units[g] in pruned.compressed for g in example.gold) / len(example.gold)
    return sum(g in pruned.kept for g in example.gold) / len(example.gold)


def gold_top(example, pruned: Pruned) -> float:
    """1.0 when the ``len(gold)`` best-scored units are exactly the gold ones (ties: the earlier unit)."""
    top = torch.argsort(torch.tensor(pruned.scores), descending=True, stable=True)[: len(example.gold)].tolist()
    return float(sorted(top) == sorted(example.gold))


def full(lm, new_tokens: int, stop_at_sentence: bool = False) -> Step:
    """The whole context."""

    def step(ex) -> tuple[dict, str]:
        r = generate_answer(lm, ex.units, ex.query, new_tokens, stop_at_sentence=stop_at_sentence)
        return {
            "acc": float(ex.is_correct(r["generated"])),
            "seconds": r["seconds"],
            "kept": 1.0,
            "gold_kept": 1.0,
            "prefill_s": r["prefill_seconds"],
            "kv_mb": kv_cache_mb(lm, r["tokens"] + r["new_tokens"]),
        }, r["generated"]

    return step


def routed(lm, choose: Callable[[object], Pruned], new_tokens: int, stop_at_sentence: bool = False) -> Step:
    """The units ``choose(example)`` keeps (a router's :meth:`~masklab.context.router.Router.choose`)."""

    def step(ex) -> tuple[dict, str]:
        pruned = choose(ex)
        r = generate_answer(lm, [pruned.text], ex.query, new_tokens, stop_at_sentence=stop_at_sentence)
        row = {
            "acc": float(ex.is_correct(r["generated"])),
            "seconds": pruned.seconds + r["seconds"],
            "prefill_s": r["prefill_seconds"],
            "kept": pruned.kept_fraction,
            "gold_kept": gold_kept(ex, pruned),
            "router_s": pruned.seconds,
            "kv_mb": kv_cache_mb(lm, r["tokens"] + r["new_tokens"]),
        }
        if pruned.compressed is None:
            row["gold_top"] = gold_top(ex, pruned)
        return row, r["generated"]

    return step


def ranked(choose: Callable[[object], Pruned]) -> Step:
    """A router's choice measured without answering (no model call after the router)."""

    def step(ex) -> tuple[dict, str]:
        pruned = choose(ex)
        return {
            "kept": pruned.kept_fraction,
            "gold_kept": gold_kept(ex, pruned),
            "gold_top": gold_top(ex, pruned),
            "router_s": pruned.seconds,
        }, ""

    return step


def pressed(lm, press, keep: float, new_tokens: int) -> Step:
    """A kvpress press (:class:`~masklab.context.presses.Press`) keeping ``keep`` of the
    context's key/value pairs at prefill; ``kv_mb``: the kept context (AdaKV masks, so all of
    it) + the rest of the prompt."""

    def step(ex) -> tuple[dict, str]:
        from transformers import DynamicCache

        cache = DynamicCache()  # the context positions the press left in it: cache_tokens
        text, secs = press.answer(ex.context, Query.parse(ex.query), keep, max_new_tokens=new_tokens, cache=cache)
        n_ctx = sum(ex.lengths(lm.tokenizer))
        ctx = n_ctx if press.masks else round(keep * n_ctx)
        rest = len(lm.tokenizer(ex.query)["input_ids"]) + new_tokens
        return {
            "acc": float(ex.is_correct(text)),
            "seconds": secs,
            "kept": keep,
            "cache_tokens": int(cache.get_seq_length()),
            "kv_mb": kv_cache_mb(lm, ctx + rest),
        }, text

    return step


def evaluate(
    examples: Sequence,
    methods: Callable[[int, object], list[tuple[str, Step]]],
    log: Path,
    key: Callable[[int, object], object] | None = None,
    after: Callable[[int, object, dict], None] | None = None,
    progress: Callable | None = None,
) -> list[dict]:
    """Every method of ``methods(i, example)`` on every example, interleaved (module docstring).

    One record per example, ``{"key", "rows": {method: row}, "answers": {method: answer}}``,
    appended to ``log`` as it finishes; ``after(i, example, record)`` may add to a record
    before it is written (evidence sets, what the example was). An example whose
    ``key(i, example)`` (default: its index ``i``) is already in ``log`` is not run again, so
    the log must belong to these settings (name it after them). Returns the records of
    ``examples``, in their order. ``progress`` wraps the example loop (e.g. a tqdm bar)."""
    key = key or (lambda i, ex: i)
    done = {r["key"]: r for r in read_jsonl(log) if "key" in r}
    records = []
    for i, ex in (progress or (lambda x: x))(list(enumerate(examples))):
        k = key(i, ex)
        if k in done:
            records.append(done[k])
            continue
        steps = methods(i, ex)
        shift = i % len(steps)
        record: dict = {"key": k, "rows": {}, "answers": {}}
        for name, step in steps[shift:] + steps[:shift]:
            record["rows"][name], record["answers"][name] = step(ex)
        full_row = record["rows"].get("full")
        for row in record["rows"].values():  # a router's share of this example's full prefill
            if "router_s" in row and full_row is not None and "prefill_s" in full_row:
                row["router_share"] = row["router_s"] / full_row["prefill_s"]
        if after is not None:
            after(i, ex, record)
        append_jsonl(log, record)
        records.append(record)
    return records


def means(records: list[dict]) -> dict[str, float]:
    """``{"<measure>|<method>": mean over the records}`` for every measure a method's rows have."""
    rows: dict[str, list[dict]] = {}
    for rec in records:
        for name, row in rec["rows"].items():
            rows.setdefault(name, []).append(row)
    return {f"{m}|{name}": sum(r[m] for r in rs) / len(rs) for name, rs in rows.items() for m in rs[0]}
