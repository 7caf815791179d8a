"""A self-contained page of a pruned document: every unit in place, the kept ones
highlighted, each unit's score on it (hover for the exact value) and in a small badge."""

from __future__ import annotations

import html

from masklab.context.router import Pruned

STYLE = """
body { font: 15px/1.6 system-ui, sans-serif; margin: 2em auto; max-width: 58em; color: #222; }
header { border-bottom: 1px solid #ccc; margin-bottom: 1em; padding-bottom: .5em; }
.doc { white-space: pre-wrap; }
.unit { border-radius: 3px; padding: 1px 2px; }
.kept { background: #ffe066; color: #111; box-shadow: 0 0 0 1px #e0b000; }
.dropped { color: #999; }
.score { font-size: 70%; color: #555; vertical-align: super; margin-left: 2px; }
.answer { background: #eef6ee; padding: .4em .6em; border-radius: 4px; }
"""


def page(pruned: Pruned, question: str, extra: dict | None = None) -> str:
    """The HTML text of the page (``extra``: lines such as the answers, shown in the header)."""
    doc = pruned.doc
    kept = set(pruned.kept)
    parts = []
    for i, unit in enumerate(doc.units):
        if i:
            gap = doc.source[doc.spans[i - 1][1] : doc.spans[i][0]] if doc.spans and doc.source else " "
            parts.append(html.escape(gap))
        cls = "kept" if i in kept else "dropped"
        s = pruned.scores[i]
        parts.append(
            f'<span class="unit {cls}" data-unit="{i}" title="unit {i}: score {s:.4g}">{html.escape(unit)}'
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
        f"<style>{STYLE}</style></head><body><header>{'<br>'.join(info)}</header>"
        f'<div class="doc">{"".join(parts)}</div></body></html>\n'
    )
