"""``masklab compress``: prune a user's document for a question before a model reads it.

    masklab compress --context report.txt --question "Who approved the budget?" --answer

Every option is declared once on :class:`CompressConfig`; the document and the question are
checked (:mod:`masklab.inputs`) before the model loads.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from masklab.context.document import UNIT_TOKENS
from masklab.errors import MasklabError
from masklab.flags import add_flags, check_ranges, config_from_args, flag
from masklab.inputs import MAX_CONTEXT_BYTES, check_question, read_text

ANSWER_ROOM = 16  # tokens kept free for the chat turns around the question


@dataclass
class CompressConfig:
    context: str = flag("", metavar="FILE", help="the document: a UTF-8 text file, or - for standard input")
    question: str = flag("", help="the question the kept text must answer")
    model: str = flag("smollm2-135m", help="registered model (see `masklab models`) or a model directory")
    keep: float = flag(0.25, above=0, max=1, help="kept fraction of the document's tokens")
    router: str = flag("bm25", help="lexical, bm25, evidence, attention, or a kvpress press (snapkv, ...: only "
                       "with --answer); `masklab compress --list-routers` lists them")
    router_file: str | None = flag(None, metavar="PATH", help="evidence/attention: a router file made by `masklab "
                                   "train-router` (the OUT/NAME.safetensors it prints) instead of the one masklab ships")
    router_model: str | None = flag(None, metavar="MODEL", default_text="--model's own router, else smollm2-135m's",
                                    help="evidence/attention: the packaged model (or model directory with a "
                                    "--router-file) whose first layers and router rank the units; --model still "
                                    "answers and counts the budget's tokens")
    fill: bool = flag(True, help="fill the kept fraction with the next-best units even where a trained router "
                      "scores them as not evidence (--no-fill: stop at its decision boundary)")
    unit_tokens: int = flag(UNIT_TOKENS, min=1, help="longest unit in tokens: longer sentences and text without sentence "
                            "punctuation (code, lists) are cut into chunks of at most this many")
    answer: bool = flag(False, help="also answer the question from the pruned text (greedy) and time it")
    compare_full: bool = flag(False, help="also answer from the whole document and time it")
    max_new_tokens: int = flag(48, min=1, help="longest answer in tokens (answers stop at the end of their first sentence)")
    prompt_format: str | None = flag(None, choices=["raw", "chat"], default_text="the model's own",
                                     help="raw completion or the model's chat turns")
    encoding: str | None = flag(None, default_text="utf-8", help="text encoding of the document, e.g. latin-1")
    max_context_bytes: int = flag(MAX_CONTEXT_BYTES, min=1, help="refuse larger documents (a guard against the wrong file)")
    json: bool = flag(False, help="print one JSON object instead of text")
    html: str | None = flag(None, metavar="FILE", help="also write a page showing the document with the kept "
                            "units highlighted and every unit's score")
    threads: int = flag(1, min=1, help="torch threads")
    progress: bool = flag(True, help="a progress bar on standard error while a trained router reads a long document "
                          "window by window")


def add_parser(sub) -> None:
    p = sub.add_parser("compress", help="prune a document to what a question needs before a model reads it",
                       description=__doc__.splitlines()[0])
    add_flags(p, CompressConfig)
    p.add_argument("--list-routers", action="store_true", help="list the routers and exit")
    p.set_defaults(handler=main)


def add_train_parser(sub) -> None:
    from masklab.context import train_router

    p = sub.add_parser("train-router", help="label, fit and measure the evidence and attention routers of a model",
                       description=train_router.__doc__.splitlines()[0])
    add_flags(p, train_router.TrainConfig)
    p.set_defaults(handler=train_main)


def train_main(args: argparse.Namespace) -> int:
    import dataclasses
    import shlex
    import sys

    from masklab.context import train_router

    cfg = config_from_args(args, train_router.TrainConfig())
    cfg = dataclasses.replace(cfg, command=getattr(args, "command_line", "masklab " + shlex.join(sys.argv[1:])),
                              device=args.device, precision=args.precision)
    return train_router.run(cfg)


def check(cfg: CompressConfig) -> None:
    """Every option, before anything is read or loaded."""
    from masklab.context.routers import ROUTERS

    if not cfg.context:
        raise MasklabError("--context is required (a text file, or - for standard input)")
    check_question(cfg.question)
    check_ranges(cfg)
    ROUTERS[cfg.router]  # noqa: B018  (unknown router: one clear error)
    if cfg.router_file and cfg.router not in ("evidence", "attention"):
        raise MasklabError("--router-file is for the trained routers (--router evidence or attention)")
    if cfg.router_model and cfg.router not in ("evidence", "attention"):
        raise MasklabError("--router-model is for the trained routers (--router evidence or attention)")
    if cfg.router in press_names() and not cfg.answer:
        raise MasklabError(f"{cfg.router} is a KV-cache press: it prunes the model's cache, not the text; add --answer")
    if cfg.html and not Path(cfg.html).expanduser().resolve().parent.is_dir():
        raise MasklabError(f"cannot write the page {cfg.html}: its folder does not exist")
    if cfg.html and (cfg.router in press_names() or cfg.router == "longllmlingua"):
        raise MasklabError(f"--html highlights the kept units; {cfg.router} keeps none (it "
                           f"{'prunes the cache' if cfg.router in press_names() else 'rewrites the text'})")


def press_names() -> list[str]:
    from masklab.context.routers.presses import press_names as names

    return names()


def main(args: argparse.Namespace) -> int:
    from masklab import device as devices
    from masklab.context.routers import ROUTERS
    from masklab.pretrained.models import check_models, check_prompt_format, load

    if args.list_routers:
        for name in ROUTERS:
            print(name)
        return 0
    cfg = config_from_args(args, CompressConfig())
    check(cfg)
    check_prompt_format(cfg.prompt_format)
    dev = devices.resolve(args.device)  # one clear error for --device cuda without a GPU, before reading
    text = read_text(cfg.context, cfg.encoding, cfg.max_context_bytes)
    check_models([cfg.model] + ([cfg.router_model] if cfg.router_model else []))
    question = check_question(cfg.question)
    lm = load(cfg.model, threads=cfg.threads, prompt_format=cfg.prompt_format, device=dev)
    with devices.autocast(dev, args.precision):
        return compress(cfg, lm, text, question)


def compress(cfg: CompressConfig, lm, text: str, question: str) -> int:
    """Prune ``text`` for ``question`` with ``lm`` loaded; print what ``cfg`` asks for."""
    from masklab.context.answer import generate_answer
    from masklab.context.document import segment
    from masklab.context.routers import load_router

    trained = {"progress": cfg.progress, "router_model": cfg.router_model,
               **({"path": cfg.router_file} if cfg.router_file else {})}
    router = load_router(cfg.router, lm, **(trained if cfg.router in ("evidence", "attention") else {}))
    doc = segment(text, lm.tokenizer, cfg.unit_tokens)
    query = f"\nQuestion: {question}\nAnswer:"
    window = int(getattr(lm.model.config, "max_position_embeddings", 2048))
    overhead = len(lm.tokenizer(query)["input_ids"]) + ANSWER_ROOM + cfg.max_new_tokens
    lengths = doc.lengths(lm.tokenizer)
    total = sum(lengths)
    out: dict = {"model": lm.name, "question": question, "router": cfg.router, "keep": cfg.keep,
                 "context_tokens": total, "model_window": window}
    notes = list(router.notes)  # which model ranked, a router fitted on few examples
    if cfg.compare_full and total + overhead > window:
        raise MasklabError(f"the whole document is {total} tokens and {lm.name} reads {window} at once: "
                           "--compare-full cannot answer from it (drop --compare-full)")
    if cfg.router in press_names():
        if total + overhead > window:
            raise MasklabError(f"the document is {total} tokens; a KV-cache press prefills all of it, past "
                               f"{lm.name}'s {window}-token window: use a router that prunes the text")
        ans, secs = router.answer(doc.source, f"\nQuestion: {question}", "Answer:", cfg.keep, cfg.max_new_tokens)
        out.update({"units": doc.units, "kept": None, "pruned_text": None, "kept_fraction": cfg.keep,
                    "router_seconds": None, "answer": ans.strip(), "answer_seconds": secs, "notes": notes})
    else:
        limit = window - overhead
        pruned = router.choose(doc, question, cfg.keep, fill=cfg.fill,
                               limit=limit if cfg.keep * total > limit else None)
        if cfg.keep * total > limit:
            notes.append(f"the document is {total} tokens: the kept units were capped at {limit} tokens to fit "
                         f"{lm.name}'s {window}-token window with the question and answer")
        if getattr(router, "last_windows", 1) > 1:
            notes.append(f"the router read the document in {router.last_windows} windows")
        pruned.notes = notes
        out.update(pruned.to_json())
        if cfg.answer:
            r = generate_answer(lm, [pruned.text], query, cfg.max_new_tokens, stop_at_sentence=True)
            out.update({"answer": r["generated"].strip(), "answer_seconds": r["seconds"]})
    if cfg.compare_full:
        r = generate_answer(lm, [doc.source], query, cfg.max_new_tokens, stop_at_sentence=True)
        out.update({"full_answer": r["generated"].strip(), "full_seconds": r["seconds"]})
    if cfg.html:
        from masklab.context.html import page

        extra = {label: out[k] for k, label in (("answer", "answer from the kept text"),
                                                ("full_answer", "answer from the whole document")) if k in out}
        try:
            Path(cfg.html).write_text(page(pruned, question, extra), encoding="utf-8")
        except OSError as e:
            raise MasklabError(f"cannot write the page {cfg.html}: {e.strerror or e}") from None
    if cfg.json:
        print(json.dumps(out, indent=1))
        return 0
    if out["pruned_text"] is not None:
        print(out["pruned_text"])
        print("---")
        what = f"kept {len(out['kept'])} of {len(doc.units)} units," if out["kept"] is not None else "rewritten to"
        print(f"{what} {out['kept_fraction']:.0%} of {total} tokens (router {cfg.router}, {out['router_seconds']:.3f} s)")
    for n in notes:
        print(f"note: {n}")
    if "answer" in out:
        print(f"answer ({cfg.router} at keep {cfg.keep}, {out['answer_seconds']:.2f} s): {out['answer']}")
    if "full_answer" in out:
        print(f"answer (full document, {out['full_seconds']:.2f} s): {out['full_answer']}")
    if cfg.html:
        print(f"page: {cfg.html}")
    return 0
