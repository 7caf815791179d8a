"""A self-contained page of a pruned document: every unit in place, the kept ones
highlighted, each unit's score on it (hover for the exact value) and in a small badge, and a
legend that says what decided: the budget or threshold, the best unit's neighbours kept with it,
and why a unit can be kept while a higher-scoring one is not (it fitted in what was left of the
budget; the other did not)."""

from __future__ import annotations

import html

from masklab.context.router import Pruned

STYLE = """
body { font: 15px/1.6 system-ui, sans-serif; margin: 2em auto; max-width: 58em; color: #222; }
header { border-bottom: 1px solid #ccc; margin-bottom: 1em; padding-bottom: .5em; }
.legend { font-size: 90%; color: #333; margin-top: .5em; }
.legend li { margin: .1em 0; }
.doc { white-space: pre-wrap; }
.unit { border-radius: 3px; padding: 1px 2px; }
.kept { background: #ffe066; color: #111; box-shadow: 0 0 0 1px #e0b000; }
.kept.near { box-shadow: 0 0 0 2px #b07d00; }
.kept.fitted { background: #fff1a8; box-shadow: 0 0 0 1px #e0b000; outline: 1px dashed #b07d00; }
.dropped { color: #999; }
.score { font-size: 70%; color: #555; vertical-align: super; margin-left: 2px; }
.answer { background: #eef6ee; padding: .4em .6em; border-radius: 4px; }
"""


def reasons(pruned: Pruned) -> dict[int, str]:
    """Why each kept unit that a reader may not expect was kept: ``near`` (one of the best unit's
    neighbours, kept right after it) or ``fitted`` (a unit scoring higher was not kept: it would
    have overflowed what was left of the budget, and this shorter one fitted)."""
    kept, scores = set(pruned.kept), pruned.scores
    if not kept:
        return {}
    top = max(range(len(scores)), key=lambda i: (scores[i], -i))
    near = {top + d for k in range(1, pruned.neighbours + 1) for d in (k, -k)} & kept
    best_dropped = max((scores[i] for i in range(len(scores)) if i not in kept), default=None)
    out = {i: "near" for i in near}
    if best_dropped is not None:
        out.update({i: "fitted" for i in kept - near - {top} if scores[i] < best_dropped})
    return out


def rule(pruned: Pruned) -> str:
    """What decided which units are kept, in words."""
    req = pruned.request
    if req is None:
        return "the router's budget"
    if req.threshold is not None:
        return f"{req.budget_text()}: every unit scoring at least {req.threshold:g}, and no other"
    if req.auto:
        cut = (
            f"at least {pruned.keep_auto:g} times the best unit's score"
            if pruned.keep_rule == "relative"
            else f"at least {pruned.keep_auto:g}"
        )
        how = f"the router's own rule: the units scoring {cut}, the best unit always"
        return f"{req.budget_text()}: {how}"
    budget = f"{req.tokens} tokens" if req.tokens is not None else f"{req.fraction:g} of the document's tokens"
    if req.cap is not None:
        budget += f" (at most {req.cap}, to fit {req.fits or 'the cap'})"
    return (
        f"{req.budget_text()}: units best score first while they fit in {budget}; a unit that would "
        "overflow what is left is skipped, and a shorter one scoring lower may still fit; the best unit "
        "is always kept"
    )


def legend(pruned: Pruned, why: dict[int, str]) -> str:
    items = [
        '<span class="unit kept">kept</span> a unit the router kept (its score in the badge)',
        '<span class="unit dropped">not kept</span> a unit it left out',
        f"<b>Decided by</b> {html.escape(rule(pruned))}",
    ]
    if pruned.neighbours:
        n = pruned.neighbours
        items.append(
            f'<span class="unit kept near">beside the best</span> the {n} unit{"s" if n > 1 else ""} on each side '
            "of the best unit, kept right after it whatever their score (the sentence that completes or "
            "heads it)"
        )
    if "fitted" in why.values():
        items.append(
            '<span class="unit kept fitted">fitted</span> kept though a unit scoring higher was not: '
            "that one was longer than what was left of the budget"
        )
    return '<ul class="legend">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def page(pruned: Pruned, question: str, extra: dict | None = None) -> str:
    """The HTML text of the page (``extra``: lines such as the answers, shown in the header)."""
    doc = pruned.doc
    kept = set(pruned.kept)
    why = reasons(pruned)

    def section(i: int) -> str:  # the unit's heading path, in its hover text
        title = doc.title_of(i)
        return f"; in {html.escape(title, quote=True)}" if title else ""

    parts = []
    for i, unit in enumerate(doc.units):
        if i:
            gap = doc.source[doc.spans[i - 1][1] : doc.spans[i][0]] if doc.spans and doc.source else " "
            parts.append(html.escape(gap))
        cls = ("kept " + why.get(i, "")).strip() if i in kept else "dropped"
        s = pruned.scores[i]
        parts.append(
            f'<span class="unit {cls}" data-unit="{i}" title="unit {i}: score {s:.4g}{section(i)}">{html.escape(unit)}'
            f'<span class="score">{s:.2f}</span></span>'
        )
    info = [
        f"<b>Question:</b> {html.escape(question)}",
        f"<b>Router:</b> {html.escape(pruned.router)} &middot; kept {len(kept)} of {len(doc.units)} units, "
        f"{pruned.kept_fraction:.0%} of the tokens &middot; {pruned.seconds:.3f} s",
    ]
    info += [f"<b>Note:</b> {html.escape(n)}" for n in pruned.notes]
    for k, v in (extra or {}).items():
        info.append(f'<div class="answer"><b>{html.escape(k)}:</b> {html.escape(str(v))}</div>')
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8"><title>masklab compress</title>'
        f"<style>{STYLE}</style></head><body><header>{'<br>'.join(info)}{legend(pruned, why)}</header>"
        f'<div class="doc">{"".join(parts)}</div></body></html>\n'
    )
