"""What ``masklab compress`` and ``masklab serve`` do with one request, in one place.

:func:`prune_document` prunes one document and :func:`prune_passages` several passages within
one budget (``keep`` of the tokens, or ``target_tokens``), both capped to fit the model's
window with the question and the answer; each returns the pruned result and the JSON object
``masklab compress --json`` prints (the answer aside: the CLI prints the pruned text before it
answers, the service answers after). :func:`answer` is that answer.
"""

from __future__ import annotations

from masklab.context.answer import answer_budget, first_answer, generate_answer
from masklab.context.passages import PrunedPassages, compress_passages
from masklab.context.router import Pruned
from masklab.text.document import Document, segment
from masklab.text.query import Query
from masklab.text.selection import AUTO


def prune_document(lm, router, text: str | Document, question: str, *, keep: float, target_tokens: int | None,
                   unit_tokens: int, fill: bool | None, max_new_tokens: int,
                   threshold: float | None = None) -> tuple[Pruned, dict]:
    """``text`` cut into units (:func:`~masklab.text.document.segment`; or a :class:`Document`
    already cut) and pruned by ``router`` for ``question`` (``threshold``: the units it scores
    at least that, instead of ``keep``); the notes say when the window
    capped the budget, the router read the document in several windows, or the top unit alone
    was over the budget."""
    doc = text if isinstance(text, Document) else segment(text, lm.tokenizer, unit_tokens)
    total = sum(doc.lengths(lm.tokenizer))
    window, overhead = answer_budget(lm, question, max_new_tokens)
    decides = keep == AUTO or threshold is not None  # the router decides how much
    budget = target_tokens if target_tokens is not None else total if decides else keep * total
    limit = window - overhead
    notes = list(router.notes)  # which model ranked, a router fitted on few examples
    if target_tokens is not None:
        pruned = router.choose(doc, question, 1.0, fill=fill, limit=min(target_tokens, limit))
    else:
        pruned = router.choose(doc, question, keep, fill=fill, limit=limit if budget > limit else None,
                               threshold=threshold)
    if budget > limit and (not decides or pruned.kept_tokens >= limit - max(pruned.lengths)):
        notes.append(f"the document is {total} tokens: the kept units were capped at {limit} tokens to fit "
                     f"{lm.name}'s {window}-token window with the question and answer")
    if router.last_windows > 1:
        notes.append(f"the router read the document in {router.last_windows} windows")
    if pruned.compressed is None and len(pruned.kept) == 1 and pruned.kept_tokens > budget and not decides:
        what = f"--target-tokens {target_tokens}" if target_tokens is not None else f"--keep {keep}"
        notes.append(f"{what} kept {pruned.kept_fraction:.0%} of the tokens: the top unit alone is "
                     f"{pruned.kept_tokens} tokens, over the budget of {budget:.0f}, and the top unit is always kept")
    pruned.notes = notes
    out = {"model": lm.name, "question": question, "router": router.name, "keep": keep,
           "target_tokens": target_tokens, **({"threshold": threshold} if threshold is not None else {}), "context_tokens": total, "model_window": window, **pruned.to_json()}
    return pruned, out


def prune_passages(lm, router, passages: list[str], question: str, *, keep: float, target_tokens: int | None,
                   unit_tokens: int, fill: bool | None, max_new_tokens: int,
                   threshold: float | None = None) -> tuple[PrunedPassages, dict]:
    """``passages`` pruned within one budget (:func:`~masklab.context.passages.compress_passages`;
    ``threshold``: the units scoring at least it, over all the passages);
    ``units``, ``kept``, ``scores`` and ``unit_tokens`` of the JSON run over every passage's
    units in order, ``passages`` has each passage's counts."""
    window, overhead = answer_budget(lm, question, max_new_tokens)
    limit = window - overhead - len(passages)  # the blank lines between the kept passages
    pruned = compress_passages(passages, question, router, keep=keep, target_tokens=target_tokens,
                               unit_tokens=unit_tokens, fill=fill, limit=limit, threshold=threshold)
    total = pruned.origin_tokens
    decides = keep == AUTO or threshold is not None  # the router decides how much
    budget = target_tokens if target_tokens is not None else total if decides else keep * total
    if budget > limit and (not decides or pruned.compressed_tokens >= limit - max(max(n) for n in pruned.lengths)):
        pruned.notes.insert(0, f"the passages are {total} tokens: the kept units were capped at {limit} tokens to fit "
                               f"{lm.name}'s {window}-token window with the question and answer")
    if router.last_windows > 1:
        pruned.notes.append(f"the router read the passages in {router.last_windows} windows")
    starts = [0]
    for doc in pruned.docs:
        starts.append(starts[-1] + len(doc.units))
    out = {"model": lm.name, "question": question, "context_tokens": total, "model_window": window, **pruned.to_json(),
           "units": [u for doc in pruned.docs for u in doc.units],
           "kept": [start + i for start, k in zip(starts, pruned.kept) for i in k],
           "scores": [x for xs in pruned.scores for x in xs], "unit_tokens": [n for ns in pruned.lengths for n in ns]}
    return pruned, out


def answer(lm, text: str, question: str, max_new_tokens: int) -> tuple[str, float]:
    """``(answer, seconds)``: the greedy answer from ``text``, its first line or sentence
    (:func:`~masklab.context.answer.first_answer`)."""
    r = generate_answer(lm, [text], Query(question).text, max_new_tokens, stop_at_sentence=True, stop_at_line=True)
    return first_answer(r["generated"]), r["seconds"]
