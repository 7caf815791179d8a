"""``masklab models`` and ``masklab cite``: the two pretrained commands that are not studies."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from masklab.pretrained.models import DEFAULT_MODEL
from masklab.util.errors import MasklabError
from masklab.util.flags import add_flags, check_ranges, config_from_args, flag
from masklab.text.inputs import MAX_CONTEXT_BYTES
from masklab.text.query import Query

CITE_METHODS = ("loo", "greedy-minimal", "group-testing", "contextcite")


@dataclass
class CiteOptions:
    """``masklab cite``'s options besides ``--context`` and ``--query`` (flags with ranges,
    :mod:`masklab.util.flags`)."""

    model: str = flag(
        DEFAULT_MODEL,
        help="registered name (see `masklab models`), a local Hugging Face model folder "
        "(/path/to/folder; see docs/pretrained.md for the architectures) or a .gguf file",
    )
    method: str = flag("group-testing", choices=list(CITE_METHODS), help="evidence search")
    hide: str = flag(
        "mask", choices=["mask", "delete"], help="hide a sentence by masking its tokens' keys or by deleting it"
    )
    tolerance: float = flag(
        1.0,
        min=0,
        help="answer 'holds' while its log-probability drops by less than this (nats) and it stays the greedy answer",
    )
    max_new_tokens: int = flag(
        32,
        min=1,
        help="at most this many answer tokens; generation stops once the answer "
        "(up to its first punctuation mark or line break) is complete",
    )
    prompt_format: str | None = flag(
        None,
        choices=["raw", "chat"],
        default_text="the model's own, see `masklab models`",
        help="raw completion or the model's chat turns",
    )
    threads: int = flag(1, min=1, help="torch threads (as the studies' runs)")
    encoding: str | None = flag(None, default_text="UTF-8", help="text encoding of the context file, e.g. latin-1")
    max_context_bytes: int = flag(MAX_CONTEXT_BYTES, min=1, help="refuse larger context files before loading the model")


def add_cite_parser(sub) -> None:
    p = sub.add_parser("cite", help="which sentences of a context a pretrained LM's answer causally depends on")
    p.add_argument("--context", required=True, help="text file with the context (- for standard input)")
    p.add_argument("--query", required=True, help="the question")
    add_flags(p, CiteOptions)
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def note(text: str) -> None:
    print(f"masklab: note: {text}", file=sys.stderr)


def sentences_of(text: str) -> list[str]:
    """The evidence items of a context (:func:`masklab.lab.tasks.base.chunked_sentences`), with a
    notice when some are chunks rather than sentences or there is only one."""
    from masklab.lab.tasks.base import CHUNK_WORDS, chunked_sentences  # cite is built on the lab

    out, cut = chunked_sentences(text)
    if cut:
        note(
            f"{cut} stretch(es) of the context had no sentence punctuation for over {2 * CHUNK_WORDS} words; "
            f"they were cut into chunks of {CHUNK_WORDS} words, so some evidence items are chunks, not sentences"
        )
    if len(out) == 1:
        note("the context is a single sentence, so it is trivially the evidence; give several sentences to compare")
    return out


def context_window(lm) -> int | None:
    """The model's window in tokens: its position embeddings, else the tokenizer's limit."""
    cfg = lm.model.config
    n = getattr(cfg, "max_position_embeddings", None) or getattr(
        getattr(cfg, "text_config", None), "max_position_embeddings", None
    )
    if not n:
        n = getattr(lm.tokenizer, "model_max_length", None)
    return int(n) if n and n < 10**8 else None


def check_fits(lm, sentences: list[str], query: str, max_new_tokens: int) -> None:
    """Refuse a prompt longer than the model's window (before any evidence search)."""
    from masklab.pretrained.lm import encode

    window = context_window(lm)
    if window is None:
        return
    n = encode(lm, sentences, Query(query).text).ids.numel()
    if n + max_new_tokens > window:
        raise MasklabError(
            f"the prompt is {n:,} tokens (context and question) + {max_new_tokens} answer tokens, past "
            f"{lm.name}'s window of {window:,} positions; shorten the context"
        )


def _models(args: argparse.Namespace) -> int:
    from masklab.pretrained.models import load, model_table

    rows = model_table()
    width = max(len(r["model"]) for r in rows)
    for r in rows:
        state = ("installed" if r["installed"] else "missing") + (", cached" if r["cached"] else "")
        print(f"{r['model']:<{width}}  {state:<18}  {r['description']}  (prompt format: {r['prompt_format']})")
        if not r["installed"]:
            print(f"{'':<{width}}  install: {r['install']}")
    print("also accepted wherever --model is: a local Hugging Face model directory or a .gguf file")
    if args.load:
        lm = load(args.load, threads=args.threads if hasattr(args, "threads") else None, device=args.device)
        lm.model  # noqa: B018  (the weights too: --load reports the whole load)
        print(
            f"loaded {args.load} from {lm.source} in {lm.load_seconds:.1f} s "
            f"({lm.n_layers} layers x {lm.n_heads} heads)"
        )
    return 0


def _cite(args: argparse.Namespace) -> int:
    from masklab.text.inputs import check_model_paths, check_question, read_text
    from masklab.pretrained.models import check_models, check_prompt_format

    # every option and the input file are checked before the model loads
    opts = config_from_args(args, CiteOptions())
    check_ranges(opts)
    check_prompt_format(opts.prompt_format)
    check_model_paths([opts.model])
    check_models([opts.model])
    query = check_question(args.query)
    text = read_text(args.context, encoding=opts.encoding, max_bytes=opts.max_context_bytes)
    sentences = sentences_of(text)
    from masklab.util import device as devices

    dev = devices.resolve(args.device)  # one clear error for --device cuda without a GPU, before loading

    from masklab.lab.lm_evidence import cite
    from masklab.pretrained.models import load

    lm = load(opts.model, threads=opts.threads, prompt_format=opts.prompt_format, device=dev)
    check_fits(lm, sentences, query, opts.max_new_tokens)
    with devices.autocast(dev, args.precision):
        res = cite(
            lm,
            sentences,
            query,
            method=opts.method,
            hide=opts.hide,
            tolerance=opts.tolerance,
            max_new_tokens=opts.max_new_tokens,
        )
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"answer: {res['answer']!r}  (log-prob {res['answer_logprob']:.2f}, prompt format {lm.prompt_format})")
    print(f"method: {res['method']}  forward passes: {res['forward_passes']}  seconds: {res['seconds']:.1f}")
    for i, s in enumerate(res["sentences"]):
        mark = "*" if i in res["evidence"] else " "
        score = res["scores"][i] if res.get("scores") else None
        extra = f"{score:+.2f}  " if score is not None else ""
        print(f" {mark} [{i}] {extra}{s}")
    return 0


def main(args: argparse.Namespace) -> int:
    return _models(args) if args.command == "models" else _cite(args)
