"""A router as a kvpress press: delete the units it does not keep *before* prefill, inside
kvpress's own ``kv-press-text-generation`` pipeline (kvpress issue #140).

kvpress's presses prune the KV cache after a full prefill (memory saved while decoding,
prefill time not). :class:`ContextPress` instead removes the tokens of the units a router
does not keep from the prefill's input itself: while the press is active it holds a
forward *pre*-hook on the decoder stack (which kvpress's pipeline calls for the prefill)
that replaces ``input_ids`` by the kept tokens and passes their original
``position_ids``. Positions keep their gaps, as key masking does in the evidence labels,
so the question that kvpress feeds afterwards at positions from the un-pruned context
length stays consistent with them. Special tokens (BOS, chat turns) are always kept.

The pipeline tokenises the context itself, so the press maps its ids back to text (decode,
re-encode with offsets): the context is ``doc``'s text when one is given, else the longest
run of ordinary tokens, cut into units by :func:`~masklab.text.document.segment`. The
router scores the units for ``question`` (kvpress itself shows its presses no question at
prefill) and :func:`~masklab.text.selection.select` keeps them.

``prefill_tokens`` / ``context_tokens`` record what the last prefill saw.
"""

from __future__ import annotations

import bisect
import contextlib
from dataclasses import dataclass, field

import torch
from torch import Tensor

from masklab.text.document import Document, segment
from masklab.util.errors import MasklabError
from masklab.pretrained.arch import base_model
from masklab.pretrained.models import PRETRAINED_EXTRA, require

require("kvpress", PRETRAINED_EXTRA)
from kvpress.presses.base_press import BasePress  # noqa: E402


def unit_starts(doc: Document, c0: int) -> list[int]:
    """Character offset of each unit of ``doc`` in a text whose context starts at ``c0``."""
    if doc.spans is not None:
        return [c0 + a for a, _ in doc.spans]
    starts, pos = [], c0
    for u in doc.units:
        starts.append(pos)
        pos += len(u) + 1
    return starts


def token_units(tokenizer, ids: Tensor, doc: Document | None) -> tuple[Tensor, Document]:
    """``unit (T,)``: the unit of ``doc`` each token of ``ids (T,)`` belongs to (its first
    non-space character decides), -1 outside the context; and the document (``doc``, or
    the context found in the decoded text and segmented)."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    if enc["input_ids"] != ids.tolist():
        raise MasklabError(
            "the context press cannot map the prefill's tokens back to text (decode and re-encode differ)"
        )
    offsets = enc["offset_mapping"]
    if doc is not None:
        c0 = text.find(doc.context)
        if c0 < 0:
            raise MasklabError("the context press's document is not in the prefill's text")
        c1 = c0 + len(doc.context)
    else:  # the longest run of ordinary (non-special) tokens
        special = set(tokenizer.all_special_ids)
        best, start = (0, 0), None
        for t, i in enumerate(ids.tolist() + [None]):
            if i is not None and i not in special and start is None:
                start = t
            elif (i is None or i in special) and start is not None:
                best = max(best, (start, t), key=lambda r: r[1] - r[0])
                start = None
        if best[1] == best[0]:
            raise MasklabError("the prefill holds no context tokens")
        c0, c1 = offsets[best[0]][0], offsets[best[1] - 1][1]
        doc = segment(text[c0:c1], tokenizer)
    starts = unit_starts(doc, c0)
    out = torch.full((ids.shape[0],), -1, dtype=torch.long)
    for t, (a, b) in enumerate(offsets):
        if b <= a:
            continue
        mid = a
        while mid < b - 1 and text[mid].isspace():
            mid += 1
        if c0 <= mid < c1:
            out[t] = max(0, bisect.bisect_right(starts, mid) - 1)
    return out, doc


@dataclass
class ContextPress(BasePress):
    """Prefill only the context tokens of the units ``router`` keeps for ``question``
    within ``keep`` of the context's tokens (module docstring); ``doc``: the context as
    units, when known (else found in the prefill and segmented)."""

    router: object = None
    question: str = ""
    keep: float = 1.0
    fill: bool | None = None
    prune_doc: object = None  # Document -> Pruned: the router's prune of the context within keep (Router.press)
    doc: Document | None = None
    prefill_tokens: int | None = field(default=None, init=False)
    context_tokens: int | None = field(default=None, init=False)
    kept: list[int] | None = field(default=None, init=False)
    _routing: bool = field(default=False, init=False, repr=False)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys, values  # nothing to drop after prefill: the context was pruned before it

    def _pre_hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None or ids.shape[1] <= 1 or self._routing:  # a trained router's own pass goes through untouched
            return None
        unit, doc = token_units(self.router.tokenizer, ids[0], self.doc)
        self._routing = True
        try:
            self.kept = self.prune_doc(doc).kept
        finally:
            self._routing = False
        keep = (unit < 0) | torch.isin(unit, torch.tensor(self.kept, dtype=torch.long))
        kwargs["input_ids"] = ids[:, keep]
        kwargs["position_ids"] = torch.arange(ids.shape[1], device=ids.device)[keep][None]
        self.context_tokens, self.prefill_tokens = int(ids.shape[1]), int(keep.sum())
        return args, kwargs

    @contextlib.contextmanager
    def __call__(self, model):
        hook = base_model(model).register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        try:
            yield
        finally:
            hook.remove()
