"""What ``masklab compress`` and ``masklab serve`` share: their flags (:class:`SharedFlags`, which
each one's config includes), a request capped to fit the model's window (:func:`fit_window`),
the JSON object both print (:func:`render`) and the answer from the pruned text (:func:`answer`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from masklab.context.router import Pruned, Request
from masklab.pretrained.models import DEFAULT_MODEL
from masklab.text.document import UNIT_TOKENS
from masklab.text.query import Query
from masklab.util.flags import flag


@dataclass
class SharedFlags:
    """The flags ``masklab compress`` and ``masklab serve`` share, declared once."""

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
        help="pruner, pruner-ctx, cross: the pruners' encoder with its linear layers in int8 (int8 "
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
    return replace(req, cap=window - overhead - gaps, fits=fits), window, overhead


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
    """``(answer, seconds)``: the greedy answer from ``text``, its first line or sentence
    (:func:`~masklab.context.answer.first_answer`)."""
    from masklab.context.answer import first_answer, generate_answer

    r = generate_answer(lm, [text], Query(question).text, max_new_tokens, stop_at_sentence=True, stop_at_line=True)
    return first_answer(r["generated"]), r["seconds"]
