"""A sentence router for a real LM, trained on causal evidence sets or on attention.

Features of a sentence come from one dense forward pass of the LM over the context (the
pre-fill every KV press also pays): the mean hidden state of the sentence's tokens at
layer ``layer`` (default: the middle), plus the sentence's relative position and length.
The router is a logistic regression on standardised features (:class:`SentenceRouter`).

Labels per training prompt (only prompts the LM answers correctly):

* ``evidence`` - the sentences whose hiding (leave-one-out, key masking) breaks the LM's
  answer (:class:`~masklab.pretrained.evidence.SentenceOracle`);
* ``attention`` - the sentences with the largest attention mass from the answer position
  (mean over layers and heads), as many as the evidence set has (at least one).

:func:`prune` keeps the highest-scored sentences within a budget of context tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from masklab.pretrained.lm import Encoded, last_token_attention
from masklab.pretrained.models import LoadedModel

ROUTER_LABELS = ("evidence", "attention")


@torch.no_grad()
def sentence_features(lm: LoadedModel, enc: Encoded, n_items: int, layer: int | None = None) -> Tensor:
    """``(N, D + 2)``: mean hidden state per sentence, relative position, relative length."""
    layer = lm.n_layers // 2 if layer is None else layer
    out = lm.model(input_ids=enc.ids[None], output_hidden_states=True, logits_to_keep=1)
    h = out.hidden_states[layer][0].float()  # (T, D)
    feats = []
    lengths = torch.bincount(enc.item_of_token[enc.item_of_token >= 0], minlength=n_items).float()
    for i in range(n_items):
        sel = enc.item_of_token == i
        feats.append(h[sel].mean(0) if sel.any() else torch.zeros(h.shape[1]))
    pos = torch.arange(n_items, dtype=torch.float32) / max(n_items - 1, 1)
    return torch.cat([torch.stack(feats), pos[:, None], (lengths / lengths.mean().clamp(min=1))[:, None]], dim=1)


@torch.no_grad()
def attention_per_sentence(lm: LoadedModel, enc: Encoded, n_items: int) -> Tensor:
    """``(N,)`` attention mass from the answer position on each sentence (mean over layers
    and heads). Needs eager attention."""
    a = last_token_attention(lm, enc.ids).mean((0, 1))  # (T,)
    out = torch.zeros(n_items)
    m = enc.item_of_token >= 0
    out.index_add_(0, enc.item_of_token[m], a[m])
    return out


@dataclass
class SentenceRouter:
    """Logistic regression ``score = w . standardise(x) + b`` over sentence features."""

    weight: Tensor
    bias: Tensor
    mean: Tensor
    std: Tensor

    @classmethod
    def fit(cls, X: Tensor, y: Tensor, steps: int = 300, lr: float = 0.05, l2: float = 1e-2, seed: int = 0) -> "SentenceRouter":
        """``X (M, F)``, ``y (M,)`` in {0, 1}; positives are re-weighted to balance classes."""
        g = torch.Generator().manual_seed(seed)
        mean, std = X.mean(0), X.std(0).clamp(min=1e-4)
        Z = (X - mean) / std
        w = (torch.randn(X.shape[1], generator=g) * 0.01).requires_grad_()
        b = torch.zeros(1, requires_grad=True)
        pos = float(y.sum().clamp(min=1))
        pw = torch.tensor((len(y) - pos) / pos)
        opt = torch.optim.Adam([w, b], lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(Z @ w + b, y.float(), pos_weight=pw) + l2 * (w ** 2).sum()
            loss.backward()
            opt.step()
        return cls(w.detach(), b.detach(), mean, std)

    def score(self, X: Tensor) -> Tensor:
        return ((X - self.mean) / self.std) @ self.weight + self.bias


def keep_within_budget(scores: Tensor, lengths: Tensor, budget: float) -> list[int]:
    """Indices (sorted) of the highest-scored sentences whose token lengths fit in
    ``budget`` x total; the top sentence is always kept."""
    limit = budget * float(lengths.sum())
    kept, used = [], 0.0
    for i in torch.argsort(scores, descending=True).tolist():
        if not kept or used + float(lengths[i]) <= limit:
            kept.append(i)
            used += float(lengths[i])
    return sorted(kept)


def sentence_lengths(enc: Encoded, n_items: int) -> Tensor:
    return torch.bincount(enc.item_of_token[enc.item_of_token >= 0], minlength=n_items).float()


def labels_for(lm: LoadedModel, sentences: list[str], query: str, attn_top: int | None = None,
               accept: Callable[[str], bool] | None = None) -> dict:
    """Evidence (leave-one-out) and attention labels of one prompt, and the oracle's answer.

    With ``accept``, a prompt whose answer is not accepted gets no labels (``"evidence"``
    is None) and costs only the answer's own passes."""
    from masklab.evidence.search import SEARCHES
    from masklab.pretrained.evidence import SentenceOracle

    oracle = SentenceOracle(lm, sentences, query, hide="mask")
    if accept is not None and not accept(oracle.answer):
        return {"answer": oracle.answer, "evidence": None, "attention": None, "passes": 1, "enc": oracle.enc}
    ev = SEARCHES["loo"].find(oracle, len(sentences))
    att = attention_per_sentence(lm, oracle.enc, len(sentences))
    k = attn_top or max(1, len(ev.items))
    top = torch.argsort(att, descending=True)[:k].tolist()
    return {"answer": oracle.answer, "evidence": ev.items, "attention": sorted(top), "passes": ev.forward_passes + 1,
            "attention_mass": att.tolist(), "enc": oracle.enc}


def prompt_with(sentences: list[str], keep: list[int]) -> list[str]:
    return [sentences[i] for i in keep]
