"""What ``masklab compress`` and ``masklab serve`` share: their flags (:class:`SharedFlags`, which
each one's config includes), a request capped to fit the model's window (:func:`fit_window`),
the JSON object both print (:func:`render`) and the answer from the pruned text (:func:`answer`).
"""

from __future__ import annotations

from dataclasses import dataclass

from masklab.context.router import DEFAULT_ROUTER, Pruned, Request
from masklab.pretrained.models import DEFAULT_MODEL
from masklab.text.document import UNIT_TOKENS
from masklab.text.inputs import MAX_CONTEXT_BYTES
from masklab.text.query import Query
from masklab.text.selection import parse_keep
from masklab.util.flags import flag

MAX_NEW_TOKENS = 512  # the longest answer one may ask for (a bound on one request's decode time)
ROUTER_HELP = (
    f"the router (default {DEFAULT_ROUTER}): pruner-ctx, pruner-passage, pruner, dense, bm25+dense, bm25, lexical, "
    "evidence, bm25+evidence, or with compress --answer a kvpress press (snapkv, ...); "
    "`masklab compress --list-routers` lists them; serve: the router of requests that name none, loaded at "
    "start (the others the first time a request names them)"
)  # tests/test_router_contract.py checks the names against the registry


@dataclass
class SharedFlags:
    """The flags ``masklab compress`` and ``masklab serve`` share, declared once (serve's apply to the
    requests that give no value of their own)."""

    keep: float | str = flag(
        0.25,
        above=0,
        max=1,
        parse=parse_keep,
        metavar="FRACTION|auto",
        help="kept fraction of the context's tokens, or auto: the router keeps the units it "
        "labels as needed (a router that decides how much); a token budget or a threshold, when "
        "given, is the budget instead",
    )
    router: str = flag(DEFAULT_ROUTER, help=ROUTER_HELP)
    max_new_tokens: int = flag(
        48,
        min=1,
        max=MAX_NEW_TOKENS,
        help="longest answer in tokens (an answer stops at the end of its first sentence or line; "
        "one cut here before that ends in …)",
    )
    max_context_bytes: int = flag(
        MAX_CONTEXT_BYTES,
        min=1,
        help="refuse larger contexts in UTF-8, all passages together (a guard against the wrong file)",
    )

    model: str = flag(
        DEFAULT_MODEL,
        help="registered model (see `masklab models`) or a model directory: it counts "
        "tokens, answers, and is read by the routers that read a model",
    )
    embedder: str | None = flag(
        None,
        metavar="DIR",
        default_text="the packaged all-MiniLM-L6-v2",
        help="dense, bm25+dense: a local sentence-transformers model folder that embeds the question and the units",
    )
    int8: bool = flag(
        False,
        help="pruner, pruner-ctx, pruner-passage: the pruners' encoder with its linear layers in int8 (int8 "
        "weights and inputs through oneDNN's int8 kernel, x86 CPUs): a faster first question on a new "
        "document, val MRR close to float's (docs/context.md)",
    )
    fill: bool = flag(
        True,
        help="fill the kept fraction with the next-best units even where they score below 0 "
        "(--no-fill: stop at the first unit scored below 0: a cosine below 0 for the embedding "
        'routers and the pruner, "not evidence" for a trained router)',
    )
    unit_tokens: int = flag(
        UNIT_TOKENS,
        min=1,
        help="longest unit in tokens: list items, tables and code stay whole "
        "up to this many; longer sentences and blocks are cut into chunks of at most this many",
    )
    prompt_format: str | None = flag(
        None,
        choices=["raw", "chat"],
        default_text="the model's own",
        help="raw completion or the model's chat turns (for answers)",
    )
    threads: int = flag(1, min=1, help="torch threads")


def fit_window(req: Request, lm, max_new_tokens: int) -> tuple[Request, int, int]:
    """``(req capped to fit lm's window with the question and the answer, the window, what the
    prompt around the context and the answer take of it)``."""
    from masklab.context.answer import answer_budget  # torch: not for parsing the flags above

    window, overhead = answer_budget(lm, req.question, max_new_tokens)
    gaps = len(req.passages) if len(req.passages) > 1 else 0  # the blank lines between the kept passages
    fits = f"{lm.name}'s {window}-token window with the question and answer"
    return req.with_(cap=window - overhead - gaps, fits=fits), window, overhead


def render(pruned: Pruned, lm, window: int) -> dict:
    """The JSON object of ``masklab compress --json`` and ``POST /v1/compress`` (docs/context.md)."""
    return {
        "model": lm.name,
        "question": pruned.request.question,
        "context_tokens": pruned.origin_tokens,
        "model_window": window,
        **pruned.to_json(),
    }


def answer(lm, text: str, question: str, max_new_tokens: int) -> tuple[str, float]:
    """``(answer, seconds)``: the greedy answer from ``text``, its first line or sentence, ending in
    `` …`` where ``max_new_tokens`` cut it before that ended (:func:`~masklab.context.answer.shown_answer`)."""
    from masklab.context.answer import generate_answer, shown_answer

    r = generate_answer(lm, [text], Query(question).text, max_new_tokens, stop_at_sentence=True, stop_at_line=True)
    return shown_answer(r["generated"], r.get("stopped", "")), r["seconds"]
