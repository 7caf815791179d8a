"""The context-aware pruner ``pruner-ctx``: each unit judged beside its neighbours and the
rest of the document, on top of the `pruner` router's scores.

The `pruner` router (:mod:`masklab.context.pruner`) scores every unit alone: ``s_i``, the
cosine of the question and the unit in its adapted MiniLM. Two-sentence answers and the
current statement beside a superseded one need more: the sentence that follows a relevant
one, a restatement of it, a later statement that replaces it. The context head reads, for
each unit, features of its neighbourhood (``FEATURES``): its own score and its neighbours'
(standardised within the document), how close it is to the document's best unit, how
similar its embedding is to its neighbours' (a continuation) and to the more relevant units
(a restatement or an update of them), and where it stands in the document. A small MLP maps
them to a residual added to ``s_i`` (zero at the start: it begins as the pruner),
and a logistic calibration turns the sum into a keep probability, so a threshold reads as
Provence's does. The unit embeddings are the pruner's, cached per document: a
further question on a document costs one question embedding and the head.

Shapes: ``units`` (N, D) unit-length embeddings, ``q`` (D,); :func:`features` -> (N, F);
:meth:`ContextHead.forward` -> (N,) logits.

Training (:mod:`masklab.lab.train_ctx`, ``masklab train-router --kind pruner-ctx``): the listwise
loss the pruner was trained with, then the calibration fitted by logistic regression on the training units. The
head is a few thousand numbers, stored as one safetensors file and a JSON file beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from masklab.util.errors import MasklabError

TEMPERATURE = 0.05  # the pruner's listwise scale
FEATURES = (
    "z",
    "z_prev",
    "z_next",
    "z_near_max",
    "gap_to_top",
    "sim_prev",
    "sim_next",
    "sim_better",
    "sim_z_near",
    "later_like_better",
    "position",
    "s",
)
NEAR = 2  # units on each side that count as neighbours
HIDDEN = 32


def neighbourhood(units: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """``(s (N,), x (N, F))``: the pruner's scores and each unit's neighbourhood features
    (module docstring; the order of :data:`FEATURES`)."""
    s = units @ q  # (N,)
    n = s.numel()
    z = (s - s.mean()) / (s.std() if n > 1 else torch.ones(())).clamp(min=1e-6)
    pad = torch.full((NEAR,), float(z.min()))
    zp = torch.cat([pad, z, pad])
    prev, nxt = zp[NEAR - 1 : NEAR - 1 + n], zp[NEAR + 1 : NEAR + 1 + n]
    near = torch.stack([zp[NEAR + k : NEAR + k + n] for k in range(-NEAR, NEAR + 1) if k != 0]).max(0).values
    sim = units @ units.T  # (N, N) cosines between units
    simp = torch.cat([torch.zeros(1), sim.diagonal(-1)])  # each unit with the one before it
    simn = torch.cat([sim.diagonal(1), torch.zeros(1)])
    better = z[None, :] > z[:, None]  # (i, j): unit j scores above unit i
    sim_better = torch.where(better, sim, torch.full_like(sim, -1.0)).max(1).values.clamp(min=-1.0)
    idx = torch.arange(n)
    window = (idx[None, :] - idx[:, None]).abs().le(NEAR) & ~torch.eye(n, dtype=torch.bool)
    sim_z = torch.where(window, sim * z[None, :], torch.full_like(sim, -10.0)).max(1).values.clamp(min=-10.0)
    # a unit like a better one that comes after it in the text (an update below, as in a changelog appended to)
    later = torch.where(better & (idx[None, :] < idx[:, None]), sim, torch.full_like(sim, -1.0)).max(1).values
    pos = idx.float() / max(1, n - 1)
    x = torch.stack([z, prev, nxt, near, z - z.max(), simp, simn, sim_better, sim_z, later, pos, s], dim=1)
    return s, x


class ContextHead(torch.nn.Module):
    """``(s (N,), x (N, F)) -> (N,)`` logits ``a * (s + mlp(x)) + b`` (module docstring); ``features``:
    F (``len(FEATURES)``; the passage pruner's head reads more, :mod:`masklab.context.passage`)."""

    def __init__(self, features: int = len(FEATURES)) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(features, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))
        torch.nn.init.zeros_(self.mlp[2].weight)  # the residual starts at zero: the pruner's ranking
        torch.nn.init.zeros_(self.mlp[2].bias)
        self.register_buffer("calibration", torch.tensor([1.0 / TEMPERATURE, 0.0]))  # a, b (fitted after training)

    def rank_scores(self, s: Tensor, x: Tensor) -> Tensor:
        """``(N,)`` the ranking score ``s + residual`` (cosine scale)."""
        return s + self.mlp(x)[:, 0]

    def forward(self, s: Tensor, x: Tensor) -> Tensor:
        a, b = self.calibration
        return a * self.rank_scores(s, x) + b


def load_head(path: Path, features: tuple[str, ...] = FEATURES) -> tuple[ContextHead, dict]:
    """The :class:`ContextHead` of a file :func:`save` wrote, and its meta; refused unless it was trained
    on ``features``."""
    from safetensors.torch import load_file

    meta_path = path.with_suffix(".json")
    if not path.is_file() or not meta_path.is_file():
        raise MasklabError(f"no context pruner at {path} (it needs {path.name} and {meta_path.name})")
    meta = json.loads(meta_path.read_text())
    if meta.get("features") != list(features):
        raise MasklabError(f"{path} was trained on other features than this version computes: retrain it")
    head = ContextHead(len(features))
    head.load_state_dict(load_file(str(path)))
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return head, meta


def probabilities(head: ContextHead, units: Tensor, q: Tensor) -> Tensor:
    """``(N,)`` keep probabilities of a document's units for a question."""
    with torch.no_grad():
        return torch.sigmoid(head(*neighbourhood(units, q)))
