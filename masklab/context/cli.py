"""``masklab compress``: prune a user's document (or several passages) for a question before a model reads it.

    masklab compress --context report.txt --question "Who approved the budget?" --answer
    masklab compress --context a.txt b.txt notes/ --question "..." --target-tokens 500

Every option is declared once on :class:`CompressConfig` (``--context``, which takes several
values, is added by :func:`add_parser`); the documents and the question are checked
(:mod:`masklab.text.inputs`) before the model loads. One document or several passages are one
:class:`~masklab.context.router.Request`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from masklab.context.compress import SharedFlags
from masklab.context.router import DEFAULT_ROUTER
from masklab.text.inputs import MAX_CONTEXT_BYTES, check_question, read_passages
from masklab.text.selection import parse_keep
from masklab.util.errors import MasklabError
from masklab.util.flags import add_flags, check_ranges, config_from_args, flag

LONG_DOCUMENT_TOKENS = 1000  # from this many tokens, answering from the whole document says so on stderr first
ROUTER_HELP = (
    f"the router (default {DEFAULT_ROUTER}): pruner-ctx, pruner, dense, bm25+dense, bm25, lexical, "
    "evidence, bm25+evidence, or a kvpress press (snapkv, ...: only with --answer); "
    "`masklab compress --list-routers` lists them"
)  # tests/test_router_contract.py checks the names
# how the CLI names a request's fields in its messages (masklab.context.router.Request.names)
FLAG_NAMES = {
    "fraction": "--keep",
    "tokens": "--target-tokens",
    "threshold": "--threshold",
    "auto": "--keep auto",
    "path": "--router-file",
    "int8": "--int8",
    "embedder": "--embedder",
    "router_model": "--router-model",
}


@dataclass
class CompressConfig(SharedFlags):
    context: list[str] = dataclasses.field(default_factory=list)  # --context (add_parser): files, folders, JSON, -
    question: str = flag("", help="the question the kept text must answer")
    keep: float | str = flag(
        0.25,
        above=0,
        max=1,
        parse=parse_keep,
        metavar="FRACTION|auto",
        help="kept fraction of the context's tokens, or auto: the router keeps the units it "
        "labels as needed (a router that decides how much; --target-tokens or --threshold, when "
        "given, is the budget instead)",
    )
    target_tokens: int | None = flag(
        None,
        min=1,
        metavar="N",
        help="keep at most N tokens of context (counted with "
        "the model's tokenizer) instead of a fraction; wins over --keep",
    )
    threshold: float | None = flag(
        None,
        metavar="T",
        help="keep the units the router scores at least T and no other "
        "(none where no unit reaches T: a note says so), as Provence does; for the routers "
        "that decide how much (pruner-ctx: keep probabilities in [0, 1]; pruner: "
        "cosines in [-1, 1]); wins over --keep",
    )
    router: str = flag(DEFAULT_ROUTER, help=ROUTER_HELP)
    router_file: str | None = flag(
        None,
        metavar="PATH",
        help="pruner, pruner-ctx, evidence, bm25+evidence: a "
        "router file made by `masklab train-router` (the OUT/NAME.safetensors it prints) "
        "instead of the one masklab ships",
    )
    router_model: str | None = flag(
        None,
        metavar="MODEL",
        default_text="--model's own router, else smollm2-135m's",
        help="evidence, bm25+evidence: the packaged model (or model directory with a "
        "--router-file) whose first layers and router rank the units; --model still "
        "answers and counts the budget's tokens",
    )
    answer: bool = flag(False, help="also answer the question from the pruned text (greedy) and time it")
    compare_full: bool = flag(False, help="also answer from the whole document and time it")
    max_new_tokens: int = flag(
        48, min=1, help="longest answer in tokens (answers stop at the end of their first sentence)"
    )
    encoding: str | None = flag(None, default_text="utf-8", help="text encoding of the document, e.g. latin-1")
    max_context_bytes: int = flag(
        MAX_CONTEXT_BYTES, min=1, help="refuse larger documents (a guard against the wrong file)"
    )
    json: bool = flag(False, help="print one JSON object instead of text")
    html: str | None = flag(
        None,
        metavar="FILE",
        help="also write a page showing the document with the kept units highlighted and every unit's score",
    )
    progress: bool = flag(
        True, help="a progress bar on standard error while a trained router reads a long document window by window"
    )


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compress",
        help="prune a document to what a question needs before a model reads it",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "--context",
        nargs="+",
        metavar="FILE",
        default=None,
        help="the document: a text file (UTF-8 unless --encoding), or - for standard input; or several "
        "passages pruned within one budget: several files, a folder (its text files, sorted by name), "
        "or a JSON list of strings (a .json file, or on standard input when it starts with [)",
    )
    add_flags(p, CompressConfig)
    p.add_argument(
        "--list-routers",
        action="store_true",
        help="list the routers, whether each reads the model and which need --answer, and exit",
    )
    p.set_defaults(handler=main)


def check(cfg: CompressConfig) -> None:
    """Every option that needs no document, before anything is read or loaded."""
    from masklab.context.presses import PRESSES
    from masklab.context.router import router_class

    if not cfg.context:
        raise MasklabError(
            "--context is required (a text file, several, a folder, a JSON list, or - for standard input)"
        )
    check_question(cfg.question)
    check_ranges(cfg)
    router_class(cfg.router)  # an unknown router: one clear error
    if cfg.router in PRESSES and not cfg.answer:
        raise MasklabError(f"{cfg.router} is a KV-cache press: it prunes the model's cache, not the text; add --answer")
    if cfg.html and not Path(cfg.html).expanduser().resolve().parent.is_dir():
        raise MasklabError(f"cannot write the page {cfg.html}: its folder does not exist")
    if cfg.html and cfg.router in PRESSES:
        raise MasklabError(f"--html highlights the kept units; {cfg.router} keeps none (it prunes the cache)")


def request_of(cfg: CompressConfig, passages: list[str]):
    """The :class:`~masklab.context.router.Request` of ``cfg`` on ``passages``: its budget and
    options checked against what the router declares."""
    from masklab.context.router import Request

    options = {
        "path": cfg.router_file,
        "int8": cfg.int8,
        "embedder": cfg.embedder,
        "router_model": cfg.router_model,
        "progress": cfg.progress,
    }
    return Request.of(
        cfg.question,
        passages,
        keep=cfg.keep,
        target_tokens=cfg.target_tokens,
        threshold=cfg.threshold,
        fill=cfg.fill,
        options=options,
        unit_tokens=cfg.unit_tokens,
        router=cfg.router,
        names=FLAG_NAMES,
    )


def check_passages(cfg: CompressConfig) -> None:
    """What several passages cannot do (checked once they are read, before the model loads)."""
    from masklab.context.presses import PRESSES

    if cfg.router in PRESSES:
        raise MasklabError(
            f"{cfg.router} prunes the model cache and keeps no units, so it cannot spend one budget "
            "across several passages: give one --context file, or a router (`--list-routers`)"
        )
    if cfg.html:
        raise MasklabError("--html shows one document: give one --context file")


def list_routers() -> None:
    """One line per router: whether it reads the model, and what else it needs."""
    from masklab.context.presses import PRESSES
    from masklab.context.routers import ROUTERS

    for name in ROUTERS:
        cls = ROUTERS[name]
        what = "reads the model" if cls.reads_model else "reads no model (only its tokenizer, to count tokens)"
        default = "; the default" if name == DEFAULT_ROUTER else ""
        print(f"{name:<26}{what}{default}" + (f"\n{'':<26}for: {cls.use}" if cls.use else ""))
    for name in PRESSES:
        print(f"{name:<26}reads the model; a KV-cache press: needs --answer, keeps no text")


def main(args: argparse.Namespace) -> int:
    from masklab.pretrained.models import check_models, check_prompt_format, load
    from masklab.util import device as devices

    if args.list_routers:
        list_routers()
        return 0
    cfg = dataclasses.replace(config_from_args(args, CompressConfig()), context=args.context or [])
    check(cfg)
    check_prompt_format(cfg.prompt_format)
    dev = devices.resolve(args.device)  # one clear error for --device cuda without a GPU, before reading
    texts, several = read_passages(cfg.context, cfg.encoding, cfg.max_context_bytes)
    if several:
        check_passages(cfg)
    req = request_of(cfg, texts)
    check_models([cfg.model] + ([cfg.router_model] if cfg.router_model else []))
    lm = load(cfg.model, threads=cfg.threads, prompt_format=cfg.prompt_format, device=dev)
    with devices.autocast(dev, args.precision):
        return compress(cfg, lm, req)


def compress(cfg: CompressConfig, lm, req) -> int:
    """Prune ``req`` (one document, or several passages) with ``lm`` loaded; print what ``cfg``
    asks for. In text mode the pruned text and its answer are printed before the whole document
    is answered (``--compare-full``)."""
    from masklab.context.compress import fit_window, render
    from masklab.context.presses import PRESSES
    from masklab.context.router import router_class, router_options
    from masklab.context.routers import load_router

    req, window, overhead = fit_window(req, lm, cfg.max_new_tokens)
    if cfg.router in PRESSES:
        return compress_press(cfg, lm, PRESSES[cfg.router](lm), req, window, overhead)
    router = load_router(cfg.router, lm, **router_options(router_class(cfg.router), req.options))
    pruned = router.prune(req)
    out, total, n = render(pruned, lm, window), pruned.origin_tokens, len(req.passages)
    if cfg.compare_full and total + (n if n > 1 else 0) + overhead > window:
        what = f"the whole document is {total} tokens" if n == 1 else f"the passages are {total} tokens together"
        raise MasklabError(
            f"{what} and {lm.name} reads {window} at once: --compare-full cannot answer from "
            f"{'it' if n == 1 else 'all of them'} (drop --compare-full)"
        )
    if n > 1:
        keeping = sum(1 for k in pruned.passage_kept if k)
        summary = (
            f"kept {len(pruned.kept)} of {len(pruned.doc.units)} units in {keeping} of {n} passages, "
            f"{pruned.kept_tokens:,} of {total:,} tokens ({pruned.ratio:.1f}x; router {cfg.router}, "
            f"{pruned.seconds:.3f} s)"
        )
    else:
        summary = (
            f"kept {len(pruned.kept)} of {len(pruned.doc.units)} units, {pruned.kept_fraction:.0%} of {total} "
            f"tokens (router {cfg.router}, {pruned.seconds:.3f} s)"
        )
    if not cfg.json:
        print_pruned(pruned.text, summary, pruned.notes)
    if cfg.answer:
        answer_into(out, "answer", "answer_seconds", lm, pruned.text, req, cfg)
    source = "\n\n".join(d.source for d in pruned.docs)
    return finish(cfg, lm, out, source, total, req, pruned.notes, pruned=pruned if n == 1 else None)


def compress_press(cfg: CompressConfig, lm, press, req, window: int, overhead: int) -> int:
    """``masklab compress --router <press> --answer``: the press answers from the whole document
    (it prefills all of it, dropping key/value pairs inside the model); no text is kept."""
    from masklab.context.answer import first_answer
    from masklab.text.document import segment
    from masklab.text.query import Query

    doc, question = segment(req.passages[0], lm.tokenizer, cfg.unit_tokens), req.question
    total = sum(doc.lengths(lm.tokenizer))
    if cfg.compare_full and total + overhead > window:
        raise MasklabError(
            f"the whole document is {total} tokens and {lm.name} reads {window} at once: "
            "--compare-full cannot answer from it (drop --compare-full)"
        )
    if total + overhead > window:
        raise MasklabError(
            f"the document is {total} tokens; a KV-cache press prefills all of it, past "
            f"{lm.name}'s {window}-token window: use a router that prunes the text"
        )
    keep = cfg.keep if cfg.target_tokens is None else min(1.0, cfg.target_tokens / total)
    ans, secs = press.answer(doc.source, Query(question), keep, cfg.max_new_tokens)
    out = {
        "model": lm.name,
        "question": question,
        "router": cfg.router,
        "keep": cfg.keep,
        "target_tokens": cfg.target_tokens,
        "context_tokens": total,
        "model_window": window,
        "units": doc.units,
        "kept": None,
        "pruned_text": None,
        "kept_fraction": keep,
        "router_seconds": None,
        "answer": first_answer(ans),
        "answer_seconds": secs,
        "notes": [],
    }
    return finish(cfg, lm, out, doc.source, total, req, [], pruned=None)


def print_pruned(text: str, summary: str, notes: list[str]) -> None:
    print(text)
    print("---")
    print(summary)
    for n in notes:
        print(f"note: {n}")
    sys.stdout.flush()


def answer_into(out: dict, key: str, seconds_key: str, lm, context: str, req, cfg: CompressConfig) -> None:
    """Answer ``req``'s question from ``context`` into ``out[key]`` (its first line or sentence) and its seconds."""
    from masklab.context.compress import answer

    out[key], out[seconds_key] = answer(lm, context, req.question, cfg.max_new_tokens)
    if not cfg.json and key == "answer":
        print_answer(f"answer ({cfg.router} at {req.budget_text()[2:]}, {out[seconds_key]:.2f} s)", out[key])


def print_answer(label: str, answer: str) -> None:
    print(f"{label}: {answer or '(empty answer)'}", flush=True)


def finish(cfg: CompressConfig, lm, out: dict, source: str, total: int, req, notes: list[str], pruned) -> int:
    """The answer from the whole document (``--compare-full``), the page and the rest of the
    output (in text mode the pruned text, its notes and its answer are already printed)."""
    if not cfg.json and "answer" in out and out.get("pruned_text") is None:  # a press: answered, no text kept
        for n in notes:
            print(f"note: {n}")
        print_answer(f"answer ({cfg.router} at {req.budget_text()[2:]}, {out['answer_seconds']:.2f} s)", out["answer"])
    if cfg.compare_full:
        if total >= LONG_DOCUMENT_TOKENS:
            print(f"answering from the whole document ({total:,} tokens)...", file=sys.stderr, flush=True)
        answer_into(out, "full_answer", "full_seconds", lm, source, req, cfg)
        if not cfg.json:
            print_answer(f"answer (full document, {out['full_seconds']:.2f} s)", out["full_answer"])
    if cfg.html:
        from masklab.context.html import page

        extra = {
            label: out[k]
            for k, label in (("answer", "answer from the kept text"), ("full_answer", "answer from the whole document"))
            if k in out
        }
        try:
            Path(cfg.html).write_text(page(pruned, out["question"], extra), encoding="utf-8")
        except OSError as e:
            raise MasklabError(f"cannot write the page {cfg.html}: {e.strerror or e}") from None
        if not cfg.json:
            print(f"page: {cfg.html}")
    if cfg.json:
        print(json.dumps(out, indent=1))
    return 0
