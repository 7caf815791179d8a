"""The peers, run on the same model and the same prompts as masklab.

* ContextCite (``context-cite==0.0.4``, MadryLab): a sparse linear surrogate fitted to
  the answer's log-probability under random sentence ablations. Made to run offline: its
  import calls ``nltk.download("punkt_tab")`` (a network fetch), which we turn into a
  no-op, and the context is given already split into our sentences through a
  :class:`BaseContextPartitioner` subclass, so its nltk sentence splitter is never used.
  The prompt is formatted as masklab formats it (:func:`masklab.pretrained.lm.prompt_parts`,
  raw or chat turns): a template that only passes the text through (plus BOS) is set
  while ContextCite runs.

kvpress's presses run through :mod:`masklab.context.presses` (:data:`~masklab.context.presses.PRESSES`).
"""

from __future__ import annotations

import contextlib

from masklab.pretrained.models import PRETRAINED_EXTRA, LoadedModel, require

PLAIN_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


@contextlib.contextmanager
def chat_template_set(tokenizer, template: str | None):
    old = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        yield
    finally:
        tokenizer.chat_template = old


def _import_context_cite():
    require("context_cite", PRETRAINED_EXTRA)
    import nltk

    real = nltk.download
    nltk.download = lambda *a, **k: False  # offline: ContextCite fetches punkt_tab at import
    try:
        import context_cite
        from context_cite.context_partitioner import BaseContextPartitioner
    finally:
        nltk.download = real
    return context_cite, BaseContextPartitioner


def presplit_partitioner(sentences: list[str]):
    """A ContextCite partitioner over sentences we already split (joined by one space)."""
    _, Base = _import_context_cite()
    import numpy as np

    class PresplitPartitioner(Base):
        def __init__(self, parts: list[str]):
            super().__init__(" ".join(parts))
            self.parts = list(parts)

        @property
        def num_sources(self) -> int:
            return len(self.parts)

        def split_context(self) -> None:  # already split
            return None

        def get_source(self, index: int) -> str:
            return self.parts[index]

        def get_context(self, mask=None) -> str:
            keep = np.ones(len(self.parts), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
            return " ".join(p for p, k in zip(self.parts, keep) if k)

    return PresplitPartitioner(sentences)


def contextcite_scores(
    lm: LoadedModel, sentences: list[str], query: str, ablations: int = 32, max_new_tokens: int = 8, seed: int = 0
) -> dict:
    """ContextCite attributions of ``lm``'s answer (the scored head of its continuation)
    to each sentence. Returns ``{"answer", "scores" (N floats), "forward_passes"}``."""
    import numpy as np
    import torch

    from masklab.text.query import answer_head

    from masklab.pretrained.lm import prompt_parts

    cc, _ = _import_context_cite()
    np.random.seed(seed)  # ContextCite draws its ablation masks with numpy's global RNG
    torch.manual_seed(seed)
    part = presplit_partitioner(sentences)
    tok = lm.tokenizer
    side = tok.padding_side
    tok.padding_side = "left"
    before, after = prompt_parts(lm, query)
    template = before.replace("{", "{{").replace("}", "}}") + "{context}" + after.replace("{", "{{").replace("}", "}}")
    plain = PLAIN_TEMPLATE
    if before and tok.bos_token and before.startswith(tok.bos_token):
        plain = PLAIN_TEMPLATE.replace("{{ bos_token }}", "")
    try:
        with chat_template_set(tok, plain):
            citer = cc.ContextCiter(
                lm.model,
                tok,
                part.context,
                query,
                partitioner=part,
                prompt_template=template,
                num_ablations=ablations,
                generate_kwargs={"max_new_tokens": max_new_tokens, "do_sample": False},
                batch_size=1,
            )
            citer.logger.setLevel("ERROR")
            response = citer.response
            head = answer_head(response)
            start = response.find(head) if head else -1
            if start < 0:
                scores = citer.get_attributions(verbose=False)
            else:
                scores = citer.get_attributions(start_idx=start, end_idx=start + len(head), verbose=False)
    finally:
        tok.padding_side = side
    return {"answer": head, "scores": [float(s) for s in scores], "forward_passes": ablations + 1}
