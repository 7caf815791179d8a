"""The trained unit routers' inference: one feature extractor and the linear router it feeds.

The router reads ``question + "\\n" + context`` through the LM's first ``layers`` decoder
layers, a pass separate from the answer's prefill and far cheaper (the first 1 / 2 layers
cost 0.033x / 0.066x of a full prefill, ``benchmarks/longctx_prefill.py``). The question
comes first because a causal LM's context states cannot see a question after them.

Features of unit ``i`` (:func:`features`, ``(N, F)``), by feature set:

* ``v2-superseded`` (the ``longctx`` reproduction's): its tokens' mean final-normed state
  minus the mean over the document's units; the cosine of its mean state with the
  question's mean state; the largest cosine of one of its tokens with the question's mean;
  relative position; relative length; the share of the question's words it contains (the
  ``lexical`` score); and how much of that share a *later* unit matches too
  (:func:`superseded`: a statement restated or updated later scores high);
* ``v3-relative`` (the shipped routers'): only what relates a unit to the question and to
  the other units, no raw hidden state (a raw state lets a router learn what the training
  facts look like instead of what the question asks): at layers 1 and ``layers``, the
  cosine of the unit's mean state with the question's; MaxSim (each question token's
  best cosine with one of the unit's tokens, averaged); the best token cosine with the
  question's mean; each of these as a z-score within the document; the ``lexical`` share,
  :func:`superseded`, BM25 over the document's units (over its maximum), the best
  neighbour's lexical share, the share of the unit's words that the three best-matching
  units hold (a link to the matched facts, for chains); relative position and length;
* ``v4-hop``: ``v3-relative`` and one hop (:func:`hop`) for facts that matter through
  another one (chains): the anchor (the unit with the best BM25) has words the question
  lacks; the units that hold them and do not match the question themselves score high.

Labels, fitting and saving are the lab's (:mod:`masklab.lab.linear_routers`: ``fit_linear``,
``attention_per_unit``, ``chunk_units``).

The router (:class:`LinearRouter`) is a logistic regression on standardised features,
stored as safetensors + JSON (read by :func:`load_routers`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from masklab.text.document import Document
from masklab.util.errors import MasklabError
from masklab.pretrained.arch import first_layers

ROUTER_LAYERS = 2
DEFAULT_FEATURE_SET = "v2-superseded"  # the longctx reproduction's; each shipped router file names its own set
FEATURE_SETS = ("v2-superseded", "v3-relative", "v4-hop")


# --------------------------------------------------------------------------- features
def router_input(tokenizer, units: list[str], question: str) -> tuple[Tensor, Tensor]:
    """``question + "\\n" + " ".join(units)`` tokenised (with the tokenizer's special
    tokens): ``ids (T,)`` and ``unit (T,)`` = unit index per token, -2 for the question's
    tokens, -1 for special tokens and the line break."""
    q = question
    text = q + "\n" + " ".join(units)
    enc = tokenizer(text, return_offsets_mapping=True)
    starts, pos = [], len(q) + 1
    for s in units:
        starts.append(pos)
        pos += len(s) + 1
    unit = torch.full((len(enc["input_ids"]),), -1, dtype=torch.long)
    for t, (a, b) in enumerate(enc["offset_mapping"]):
        if b <= a:
            continue
        if b <= len(q):
            unit[t] = -2
            continue
        mid = a  # the token's first non-space character decides its unit
        while mid < b - 1 and text[mid] in " \n":
            mid += 1
        if mid > len(q):
            unit[t] = bisect.bisect_right(starts, mid) - 1
    return torch.tensor(enc["input_ids"]), unit


def superseded(overlap: list[float]) -> list[float]:
    """Per unit: ``min(overlap[i], max(overlap[j] for j > i))`` (0 for the last), the part
    of its match with the question that a later unit matches at least as well."""
    out, later = [0.0] * len(overlap), 0.0
    for i in range(len(overlap) - 1, -1, -1):
        out[i] = min(overlap[i], later)
        later = max(later, overlap[i])
    return out


@torch.no_grad()
def features(
    lm, units: list[str], question: str, layers: int = ROUTER_LAYERS, kind: str = DEFAULT_FEATURE_SET
) -> Tensor:
    """``(N, F)`` features of ``units`` from the first ``layers`` layers over
    ``question + "\\n" + context`` (module docstring); ``question`` without answer prefix."""
    from masklab.context.routers.lexical import question_overlap

    if kind not in FEATURE_SETS:
        raise MasklabError(f"unknown router feature set {kind!r}; choose from {', '.join(FEATURE_SETS)}")
    ids, unit = router_input(lm.tokenizer, units, question)
    with first_layers(lm.model, layers) as base:  # on the model's device; the feature maths on the CPU
        out = base(input_ids=ids[None].to(lm.model.device), use_cache=False, output_hidden_states=True)
    h = out.last_hidden_state[0].float().cpu()  # (T, D), final-normed
    n = len(units)
    m = unit >= 0
    count = torch.bincount(unit[m], minlength=n).float()
    isq = unit == -2

    def unit_mean(x: Tensor) -> Tensor:  # (T, D) -> (N, D)
        return torch.zeros(n, x.shape[1]).index_add_(0, unit[m], x[m]) / count.clamp(min=1)[:, None]

    mean = unit_mean(h)
    qm = h[isq].mean(0) if isq.any() else h.mean(0)
    cos_mean = torch.nn.functional.cosine_similarity(mean, qm[None], dim=1)
    tok_cos = torch.nn.functional.cosine_similarity(h, qm[None], dim=1)
    cos_max = torch.full((n,), -1.0).scatter_reduce_(0, unit[m], tok_cos[m], reduce="amax")
    pos = torch.arange(n, dtype=torch.float32) / max(n - 1, 1)
    rel_len = count / count.mean().clamp(min=1)
    overlap = question_overlap(units, question)
    if kind == "v2-superseded":
        extra = torch.stack(
            [cos_mean, cos_max, pos, rel_len, torch.tensor(overlap), torch.tensor(superseded(overlap))], dim=1
        )
        return torch.cat([mean - mean.mean(0, keepdim=True), extra], dim=1)
    h1 = out.hidden_states[1][0].float().cpu()  # after the first layer (not normed)
    q1 = h1[isq].mean(0) if isq.any() else h1.mean(0)
    cos1 = torch.nn.functional.cosine_similarity(unit_mean(h1), q1[None], dim=1)
    hn = torch.nn.functional.normalize(h, dim=1)
    sim = hn[m] @ hn[isq].T if isq.any() else torch.zeros(int(m.sum()), 1)  # (T_ctx, Q) token cosines
    best = torch.full((n, sim.shape[1]), -1.0).scatter_reduce_(0, unit[m][:, None].expand_as(sim), sim, reduce="amax")
    maxsim = best.mean(1)

    def z(x: Tensor) -> Tensor:
        return (x - x.mean()) / x.std().clamp(min=1e-4) if n > 1 else torch.zeros_like(x)

    ov = torch.tensor(overlap)
    neighbour = torch.maximum(torch.cat([ov[1:], ov.new_zeros(1)]), torch.cat([ov.new_zeros(1), ov[:-1]]))
    bm = bm25_scores(units, question)
    extra = torch.stack(
        [
            cos1,
            cos_mean,
            maxsim,
            cos_max,
            z(cos1),
            z(cos_mean),
            z(maxsim),
            z(cos_max),
            ov,
            torch.tensor(superseded(overlap)),
            bm / bm.max().clamp(min=1e-6),
            neighbour,
            link(units, overlap, question),
            pos,
            rel_len,
        ],
        dim=1,
    )
    if kind == "v3-relative":
        return extra
    return torch.cat([extra, hop(units, question, bm, ov)[:, None]], dim=1)  # v4-hop


def bm25_scores(units: list[str], question: str) -> Tensor:
    """``(N,)`` BM25 of ``question`` against each unit (the ``bm25`` router's score)."""
    from masklab.context.routers.bm25 import BM25

    return BM25().score(Document(units=units), question)


def link(units: list[str], overlap: list[float], question: str, top: int = 3) -> Tensor:
    """``(N,)``: the share of a unit's words (not the question's) found in the ``top`` units
    that match the question best (0 for those units and when nothing matches)."""
    from masklab.context.routers.lexical import words

    order = sorted((i for i in range(len(units)) if overlap[i] > 0), key=lambda i: -overlap[i])[:top]
    q = words(question)
    linked = set().union(*(words(units[i]) for i in order)) - q if order else set()
    out = torch.zeros(len(units))
    for i, u in enumerate(units):
        w = words(u) - q
        if i not in order and w:
            out[i] = len(w & linked) / len(w)
    return out


def hop(units: list[str], question: str, bm: Tensor, overlap: Tensor) -> Tensor:
    """``(N,)``: one hop from the *anchor*, the unit with the best BM25 ``bm (N,)`` for the
    question: the BM25 of each unit for the anchor's words that are not the question's (over
    the anchor's own score, the maximum; 0 for the anchor), times the share of the question's
    words the unit lacks (``1 - overlap (N,)``). High for the fact a chain's link points to."""
    from masklab.context.routers.lexical import words

    a = int(bm.argmax())
    second = " ".join(sorted(words(units[a]) - words(question)))
    out = bm25_scores(units, second) if bm.max() > 0 and second else torch.zeros(len(units))
    out = out / out.max().clamp(min=1e-6)
    out[a] = 0.0
    return out * (1 - overlap)


# --------------------------------------------------------------------------- the router
@dataclass
class LinearRouter:
    """Logistic regression ``score = w . standardise(x) + b`` over unit features."""

    weight: Tensor
    bias: Tensor
    mean: Tensor
    std: Tensor

    def score(self, X: Tensor) -> Tensor:
        """``X (N, F)`` -> ``(N,)`` logits."""
        if X.shape[-1] != self.weight.shape[0]:
            raise MasklabError(
                f"this router takes {self.weight.shape[0]} features per unit, got {X.shape[-1]}: "
                "it was trained for another model or feature set"
            )
        return ((X - self.mean) / self.std) @ self.weight + self.bias


def load_routers(path: Path) -> tuple[dict[str, LinearRouter], dict]:
    """The routers and meta :func:`save_routers` wrote at ``path`` (no suffix)."""
    from safetensors.torch import load_file

    from masklab.util.files import read_json

    path = Path(path)
    if not path.with_suffix(".json").is_file() or not path.with_suffix(".safetensors").is_file():
        raise MasklabError(f"no trained router at {path} (.json + .safetensors)")
    t = load_file(str(path.with_suffix(".safetensors")))
    meta = read_json(path.with_suffix(".json"))
    return {k: LinearRouter(*(t[f"{k}.{f}"] for f in ("weight", "bias", "mean", "std"))) for k in meta["kinds"]}, meta


def router_stem(model: str) -> str:
    """The file name (no suffix) of ``model``'s routers in a ``train-router`` folder: the
    registered name, or a folder's or file's own name (letters, digits, ``-`` and ``_``
    kept, so no dot reads as a suffix)."""
    import re

    return re.sub(r"[^\w-]+", "_", Path(model).expanduser().name) or "model"


def same_model(a: str, b: str) -> bool:
    """Whether two ``--model`` values name the same model (one path written two ways too)."""
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()
