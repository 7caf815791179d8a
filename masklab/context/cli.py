"""``masklab compress``: prune a user's document (or several passages) for a question before a model reads it.

    masklab compress --context report.txt --question "Who approved the budget?" --answer
    masklab compress --context a.txt b.txt notes/ --question "..." --target-tokens 500

Every option is declared once, on :class:`CompressConfig` or the :class:`SharedFlags` it shares
with ``masklab serve`` (``--context``, which takes several values, is added by :func:`add_parser`);
the documents and the question are checked (:mod:`masklab.text.inputs`) before the model loads.
One document or several passages are one :class:`~masklab.context.router.Request`.

Standard output holds only what a user pipes on: the pruned text (several passages each after a
``==> NAME <==`` line, as ``head`` separates files) and the answers asked for, or the JSON object;
the summary, the notes, the progress and the ``page:`` line go to standard error, and ``--quiet``
drops them (errors stay).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from masklab.context.compress import SharedFlags
from masklab.context.router import DEFAULT_ROUTER
from masklab.text.inputs import Passages, check_question, read_passages
from masklab.util.errors import MasklabError
from masklab.util.flags import add_flags, check_ranges, config_from_args, flag

LONG_DOCUMENT_TOKENS = 1000  # from this many tokens, answering from the whole document says so on stderr first
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
    question: str = flag("", help="the question the kept text must answer (required)")
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
        "that decide how much (pruner-passage, pruner-ctx: keep probabilities in [0, 1]; pruner: "
        "cosines in [-1, 1]); wins over --keep",
    )
    router_file: str | None = flag(
        None,
        metavar="PATH",
        help="pruner, pruner-ctx, pruner-passage, evidence, bm25+evidence: a "
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
    encoding: str | None = flag(None, default_text="utf-8", help="text encoding of the document, e.g. latin-1")
    json: bool = flag(False, help="print one JSON object instead of text")
    html: str | None = flag(
        None,
        metavar="FILE",
        help="also write a page showing the document with the kept units highlighted and every unit's score",
    )
    progress: bool = flag(
        True, help="a progress bar on standard error while a trained router reads a long document window by window"
    )
    quiet: bool = flag(
        False,
        help="standard error only for errors: no summary, notes, progress bar, page line or library warnings "
        "(standard output holds the pruned text or the JSON either way)",
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
    from masklab.context.presses import PRESSES, refuse_press
    from masklab.context.router import router_class

    if not cfg.context:
        raise MasklabError(
            "--context is required (a text file, several, a folder, a JSON list, or - for standard input)"
        )
    check_question(cfg.question)
    check_ranges(cfg)
    router_class(cfg.router)  # an unknown router: one clear error
    if cfg.router in PRESSES and not cfg.answer:
        refuse_press(cfg.router, "add --answer")
    if cfg.html and not Path(cfg.html).expanduser().resolve().parent.is_dir():
        raise MasklabError(f"cannot write the page {cfg.html}: its folder does not exist")
    if cfg.html and cfg.router in PRESSES:
        refuse_press(cfg.router, "--html highlights kept units: drop --html")


def request_of(cfg: CompressConfig, passages: Passages):
    """The :class:`~masklab.context.router.Request` of ``cfg`` on ``passages`` (their names its
    ``sources``): its budget and options checked against what the router declares, once."""
    from masklab.context.router import Request

    options = {
        "path": cfg.router_file,
        "int8": cfg.int8,
        "embedder": cfg.embedder,
        "router_model": cfg.router_model,
        "progress": cfg.progress and not cfg.quiet,
    }
    return Request.of(
        cfg.question,
        passages.texts,
        sources=passages.names,
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
    from masklab.context.presses import PRESSES, refuse_press

    if cfg.router in PRESSES:
        refuse_press(
            cfg.router, "it cannot spend one budget across several passages: give one --context file, or a router"
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
        decides = "; decides how much (--threshold, --keep auto)" if cls.score_range is not None else ""
        default = "; the default" if name == DEFAULT_ROUTER else ""
        print(f"{name:<26}{what}{decides}{default}" + (f"\n{'':<26}for: {cls.use}" if cls.use else ""))
    for name in PRESSES:
        print(f"{name:<26}reads the model; a KV-cache press: needs --answer, keeps no text")


def main(args: argparse.Namespace) -> int:
    from masklab.pretrained.models import check_models, check_prompt_format, load
    from masklab.util import device as devices

    if args.list_routers:
        list_routers()
        return 0
    cfg = dataclasses.replace(config_from_args(args, CompressConfig()), context=args.context or [])
    if cfg.quiet:
        warnings.simplefilter("ignore")  # a library's warning is no error: --quiet leaves stderr to errors
    check(cfg)
    check_prompt_format(cfg.prompt_format)
    dev = devices.resolve(args.device)  # one clear error for --device cuda without a GPU, before reading
    passages = read_passages(cfg.context, cfg.encoding, cfg.max_context_bytes)
    if passages.several:
        check_passages(cfg)
    req = request_of(cfg, passages)
    check_models([cfg.model] + ([cfg.router_model] if cfg.router_model else []))
    lm = load(cfg.model, threads=cfg.threads, prompt_format=cfg.prompt_format, device=dev)
    with devices.autocast(dev, args.precision):
        return compress(cfg, lm, req, passages.skipped)


def say(cfg: CompressConfig, line: str) -> None:
    """A line for the user, not for the pipe: standard error, unless ``--quiet``."""
    if not cfg.quiet:
        print(line, file=sys.stderr, flush=True)


def compress(cfg: CompressConfig, lm, req, skipped: list[str] = ()) -> int:
    """Prune ``req`` (one document, or several passages) with ``lm`` loaded; print what ``cfg``
    asks for (module docstring); ``skipped``: what a folder read left out, noted. In text mode the
    pruned text and its answer are printed before the whole document is answered (``--compare-full``)."""
    from masklab.context.compress import answer, fit_window, render
    from masklab.context.presses import PRESSES
    from masklab.context.router import router_class, router_options
    from masklab.context.routers import load_router

    req, window, overhead = fit_window(req, lm, cfg.max_new_tokens)
    answered: dict = {}
    if cfg.router in PRESSES:
        pruned, answered = compress_press(cfg, lm, PRESSES[cfg.router](lm), req, window, overhead)
    else:
        router = load_router(cfg.router, lm, **router_options(router_class(cfg.router), req.options))
        pruned = router.prune(req)
    pruned.notes[:0] = skipped
    out, total, n = {**render(pruned, lm, window), **answered}, pruned.origin_tokens, len(req.passages)
    if cfg.compare_full and total + (n if n > 1 else 0) + overhead > window:
        what = f"the whole document is {total} tokens" if n == 1 else f"the passages are {total} tokens together"
        raise MasklabError(
            f"{what} and {lm.name} reads {window} at once: --compare-full cannot answer from "
            f"{'it' if n == 1 else 'all of them'} (drop --compare-full)"
        )
    if not cfg.json:
        print_pruned(cfg, pruned)
    if cfg.answer and pruned.cache_fraction is None:
        out["answer"], out["answer_seconds"] = answer(lm, pruned.text, req.question, cfg.max_new_tokens)
    if cfg.answer and not cfg.json:
        print_answer(f"answer ({cfg.router} at {req.budget_text()[2:]}, {out['answer_seconds']:.2f} s)", out["answer"])
    source = "\n\n".join(d.source for d in pruned.docs)
    return finish(cfg, lm, out, source, total, req, pruned=pruned if n == 1 and pruned.text is not None else None)


def compress_press(cfg: CompressConfig, lm, press, req, window: int, overhead: int) -> tuple:
    """``masklab compress --router <press> --answer``: the press answers from the whole document
    (it prefills all of it, dropping key/value pairs inside the model); no text is kept. Returns the
    :class:`~masklab.context.router.Pruned` of a press (its ``cache_fraction``) and
    ``{answer, answer_seconds}``."""
    from masklab.context.answer import first_answer
    from masklab.context.router import Pruned
    from masklab.text.document import segment
    from masklab.text.query import Query

    doc, question = segment(req.passages[0], lm.tokenizer, cfg.unit_tokens), req.question
    lengths = doc.lengths(lm.tokenizer)
    total = sum(lengths)
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
    keep = req.fraction if req.tokens is None else min(1.0, req.tokens / total)
    ans, secs = press.answer(doc.source, Query(question), keep, cfg.max_new_tokens)
    pruned = Pruned(doc, [], [], lengths, 0.0, cfg.router, request=req, cache_fraction=keep)
    return pruned, {"answer": first_answer(ans), "answer_seconds": secs}


def print_pruned(cfg: CompressConfig, pruned) -> None:
    """The pruned text on standard output (several passages: each that keeps anything after a
    ``==> NAME <==`` line), then its summary and notes on standard error."""
    n = len(pruned.docs)
    if pruned.text is not None:
        if n > 1:
            blocks = [f"==> {name} <==\n{text}" for name, text in zip(pruned.sources, pruned.texts) if text]
            print("\n\n".join(blocks), flush=True)
        else:
            print(pruned.text, flush=True)
    total, router = pruned.origin_tokens, pruned.router
    if pruned.cache_fraction is not None:
        summary = f"kept {pruned.cache_fraction:.0%} of the key/value pairs of {total} tokens (press {router})"
    elif n > 1:
        keeping = sum(1 for k in pruned.passage_kept if k)
        summary = (
            f"kept {len(pruned.kept)} of {len(pruned.doc.units)} units in {keeping} of {n} passages, "
            f"{pruned.kept_tokens:,} of {total:,} tokens ({pruned.ratio:.1f}x; router {router}, "
            f"{pruned.seconds:.3f} s)"
        )
    else:
        summary = (
            f"kept {len(pruned.kept)} of {len(pruned.doc.units)} units, {pruned.kept_fraction:.0%} of {total} "
            f"tokens (router {router}, {pruned.seconds:.3f} s)"
        )
    say(cfg, summary)
    for note in pruned.notes:
        say(cfg, f"note: {note}")


def print_answer(label: str, answer: str) -> None:
    """An answer the user asked for (``--answer``, ``--compare-full``): standard output."""
    print(f"{label}: {answer or '(empty answer)'}", flush=True)


def finish(cfg: CompressConfig, lm, out: dict, source: str, total: int, req, pruned) -> int:
    """The answer from the whole document (``--compare-full``), the page and the rest of the
    output (in text mode the pruned text, its notes and its answer are already printed)."""
    if cfg.compare_full:
        from masklab.context.compress import answer

        if total >= LONG_DOCUMENT_TOKENS:
            say(cfg, f"answering from the whole document ({total:,} tokens)...")
        out["full_answer"], out["full_seconds"] = answer(lm, source, req.question, cfg.max_new_tokens)
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
        say(cfg, f"page: {cfg.html}")
    if cfg.json:
        print(json.dumps(out, indent=1))
    return 0
