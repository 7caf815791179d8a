"""Structure matrices derived from causal interventions instead of written by hand (issue 15).

Two sources of evidence, both restricted to the *training domain*:

* a **black-box function** ``f`` known only on the seen points of the Boolean cube
  (:func:`function_effects`): the first-order effect of variable ``j`` is how often flipping
  ``x_j`` changes ``f`` over seen points whose flipped neighbour is also seen; the
  second-order interaction of ``(i, j)`` is the mean absolute mixed difference
  ``f(x) - f(x^i) - f(x^j) + f(x^{ij})`` over points whose four corners are all seen. A pair
  with no such point is **not identifiable** from the training domain and is reported with
  the reason;
* a **probe model** (:func:`probe_effects`): a dense :class:`~masklab.models.TokenEncoder`
  trained briefly on the training data; each key ``j`` is hidden from each query ``i`` with
  an additive ``-inf`` logit bias (the core's bias path, in every block) and the change in
  query ``i``'s final hidden state (for CLS: the model output) is recorded as "query i needs
  key j".

:func:`to_structure` turns effects into a ``(T, T)`` structure with a relative threshold or
a top-k per row; :func:`derived_groups` turns a Boolean interaction graph into the
interaction groups that the hand-built designs (:mod:`masklab.priors.structures`) take, so a
derived prior uses exactly the same design builder as the hand-built one.
:func:`shuffled` is the control: the same number of allowed off-diagonal entries, placed at
random.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from masklab.util import device as devices

# ----------------------------------------------------------------------------- black box


@dataclass
class FunctionEffects:
    """Effects of a function measured on its seen domain.

    first: ``(n,)`` fraction of valid flip-pairs whose value changes (nan: no valid pair).
    pair: ``(n, n)`` mean ``|mixed difference|`` over valid squares (nan: not identifiable).
    squares: ``(n, n)`` number of seen points whose four corners are all seen.
    queries: distinct function evaluations used (the seen points read).
    seconds: wall time of the derivation.
    """

    first: np.ndarray
    pair: np.ndarray
    squares: np.ndarray
    queries: int
    seconds: float

    def unidentifiable(self) -> list[tuple[int, int]]:
        """Pairs ``i < j`` with no seen square."""
        n = len(self.first)
        return [(i, j) for i in range(n) for j in range(i + 1, n) if self.squares[i, j] == 0]


def _flip_index(n: int, bits: tuple[int, ...]) -> np.ndarray:
    """Row index of each point of :func:`masklab.lab.tasks.boolean.cube` with ``bits`` flipped
    (row r holds the bits of r, so flipping x_j is ``r ^ (1 << j)``)."""
    r = np.arange(2**n)
    for b in bits:
        r = r ^ (1 << b)
    return r


def function_effects(y: np.ndarray, seen: np.ndarray, tol: float = 1e-9) -> FunctionEffects:
    """First- and second-order effects of a function on the Boolean cube, from seen points only.

    y: ``(2^n,)`` values in the row order of :func:`masklab.lab.tasks.boolean.cube`; only
        ``y[seen]`` is read. seen: ``(2^n,)`` bool.
    tol: a difference larger than this counts as a change.
    """
    start = time.perf_counter()
    P = len(y)
    n = int(round(np.log2(P)))
    if 2**n != P or seen.shape != (P,):
        raise ValueError(f"y and seen must have 2^n entries in cube order, got {P} and {seen.shape}")
    f = np.where(seen, y.astype(np.float64), np.nan)  # nothing outside the seen domain is read
    first = np.full(n, np.nan)
    for j in range(n):
        fj = f[_flip_index(n, (j,))]
        ok = seen & seen[_flip_index(n, (j,))]
        if ok.any():
            first[j] = float(np.mean(np.abs(f[ok] - fj[ok]) > tol))
    pair = np.full((n, n), np.nan)
    squares = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        for j in range(i + 1, n):
            fi, fj, fij = (_flip_index(n, b) for b in ((i,), (j,), (i, j)))
            ok = seen & seen[fi] & seen[fj] & seen[fij]
            squares[i, j] = squares[j, i] = int(ok.sum())
            if ok.any():
                mixed = f[ok] - f[fi][ok] - f[fj][ok] + f[fij][ok]
                pair[i, j] = pair[j, i] = float(np.mean(np.abs(mixed)))
    return FunctionEffects(first, pair, squares, int(seen.sum()), time.perf_counter() - start)


def significant(effects: np.ndarray, threshold: float = 0.05) -> np.ndarray:
    """Bool mask of entries above ``threshold`` times the largest finite effect (nan: False;
    all-zero effects: nothing is significant)."""
    e = np.nan_to_num(np.asarray(effects, dtype=np.float64), nan=0.0)
    top = e.max() if e.size else 0.0
    return (e > threshold * top) & (e > 0) if top > 0 else np.zeros(e.shape, dtype=bool)


@dataclass
class Interactions:
    """A Boolean task's interaction graph as derived from evidence.

    variables: variables with a significant first-order effect (or an identified interaction).
    pairs: identified interacting pairs ``(i, j)``, ``i < j``.
    assumed: unidentifiable pairs of two effective variables that the policy kept (``allow``).
    unidentifiable: every unidentifiable pair ``(i, j, reason)``.
    """

    variables: list[int]
    pairs: list[tuple[int, int]]
    assumed: list[tuple[int, int]] = field(default_factory=list)
    unidentifiable: list[tuple[int, int, str]] = field(default_factory=list)


UNIDENTIFIABLE_POLICIES = ("allow", "drop")


def interactions(fx: FunctionEffects, threshold: float = 0.05, unidentifiable: str = "allow") -> Interactions:
    """Threshold a :class:`FunctionEffects` into an interaction graph.

    unidentifiable: what a pair that the seen domain cannot measure becomes when both of its
        variables have an effect: ``"allow"`` (default: the prior suppresses only what the
        evidence shows to be absent) or ``"drop"`` (only measured interactions are allowed).
    """
    if unidentifiable not in UNIDENTIFIABLE_POLICIES:
        raise ValueError(f"unknown policy {unidentifiable!r}; choose one of {UNIDENTIFIABLE_POLICIES}")
    n = len(fx.first)
    pair_on = significant(fx.pair, threshold)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if pair_on[i, j]]
    variables = sorted(set(np.flatnonzero(significant(fx.first, threshold)).tolist()) | {v for p in pairs for v in p})
    reasons, assumed = [], []
    for i, j in fx.unidentifiable():
        reasons.append((i, j, f"no seen point has all four corners of the (x{i}, x{j}) square in the seen domain"))
        if unidentifiable == "allow" and i in variables and j in variables:
            assumed.append((i, j))
    return Interactions(variables, pairs, assumed, reasons)


def derived_groups(inter: Interactions) -> list[tuple[int, ...]]:
    """Interaction groups for :mod:`masklab.priors.structures`' designs: each interacting pair
    (identified or assumed) and each effective variable on its own (so it joins the support)."""
    pairs = sorted(set(inter.pairs) | set(inter.assumed))
    alone = [(v,) for v in inter.variables if not any(v in p for p in pairs)]
    return [*pairs, *alone]


def from_interventions(
    y: np.ndarray,
    seen: np.ndarray,
    design,
    depth: int = 1,
    heads: int = 1,
    threshold: float = 0.05,
    unidentifiable: str = "allow",
) -> tuple[list[Tensor], Interactions, FunctionEffects]:
    """The one-call path for a Boolean task: effects of the black box ``y`` on the ``seen``
    domain (:func:`function_effects`), thresholded into an interaction graph
    (:func:`interactions`), turned into groups and built by ``design`` (a callable
    ``(groups, n_vars, layer, depth, heads) -> (H|1, T, T)`` or (T, T), e.g. an entry of
    :data:`masklab.priors.structures.DESIGNS`). Returns one ``(H|1, T, T)`` structure per block, the
    graph (with the unidentifiable pairs and their reasons) and the raw effects."""
    fx = function_effects(y, seen)
    inter = interactions(fx, threshold, unidentifiable)
    groups = derived_groups(inter)
    if not groups:
        raise ValueError("no variable has an effect on the seen domain; nothing to derive")
    n = len(fx.first)
    structures = []
    for layer in range(depth):
        s = design(groups, n, layer, depth, heads)
        structures.append(s if s.dim() == 3 else s[None])
    return structures, inter, fx


# ----------------------------------------------------------------------------- probe model


@dataclass
class ProbeEffects:
    """effects: ``(T, T)`` mean change of query i's output when key j is hidden (nan: not
    measured: a row outside ``rows``, a key the model's own mask already hides, or the only
    key a row has). forwards: hiding forward passes (each on ``points`` inputs) plus the one
    unhidden pass; seconds: wall time."""

    effects: np.ndarray
    forwards: int
    points: int
    seconds: float


@torch.no_grad()
def _outputs(model, inputs: Tensor, bias: Tensor | None) -> Tensor:
    """``(B, T, D)`` final hidden states (after the model's LayerNorm) of any masklab model with
    ``embed``/``base_bias``/``blocks``/``ln`` (TokenEncoder, GPT, ViT), with ``bias``
    ``(B|1, 1, T, T)`` added to the model's own bias (causal for the GPT) in every block."""
    x = model.embed(inputs)
    base = model.base_bias(x.shape[1], x.device)
    mask = bias if base is None else (base if bias is None else base + bias)
    for block in model.blocks:
        x, _ = block(x, mask, False)
    return model.ln(x)


def _change(model, h: Tensor, base: Tensor, row: int, head_rows: set[int], distribution: bool) -> Tensor:
    """``(B,)`` change of query ``row``'s output: a head row through ``model.head`` (total
    variation of the softmax with ``distribution``, else ``|delta| / mean |output|``), any
    other row as ``||delta h|| / mean ||h||`` of its final hidden state."""
    if row in head_rows:
        new, old = model.head(h[:, row]), model.head(base[:, row])
        if distribution:
            return 0.5 * (new.softmax(-1) - old.softmax(-1)).abs().sum(-1)
        return (new - old).abs().mean(-1) / (old.abs().mean() + 1e-12)
    return (h[:, row] - base[:, row]).norm(dim=-1) / (base[:, row].norm(dim=-1).mean() + 1e-12)


def _hidings_of(base_bias: Tensor | None, T: int, rows: list[int], pairs: bool) -> list[tuple[int, tuple[int, ...]]]:
    """``(row, keys)`` interventions: each key (or each pair of keys) that the model's own bias
    leaves visible to ``row``, skipping any that would leave the row with no key at all."""
    visible = [[j for j in range(T) if base_bias is None or torch.isfinite(base_bias[i, j])] for i in range(T)]
    out = []
    for i in rows:
        keys = visible[i]
        sets = [(a, b) for n, a in enumerate(keys) for b in keys[n + 1 :]] if pairs else [(j,) for j in keys]
        out += [(i, ks) for ks in sets if len(ks) < len(keys)]
    return out


@torch.no_grad()
def _hide(
    model, inputs: Tensor, hidings, head_rows: set[int], distribution: bool, chunk: int
) -> tuple[list[float], int]:
    """Mean change of each ``(row, keys)`` hiding over ``inputs`` ``(B, ...)``; hidings run
    ``chunk`` at a time, each a copy of the batch with its own ``-inf`` logit bias (on the
    device of ``inputs``, which is the model's)."""
    B = len(inputs)
    base = _outputs(model, inputs, None)
    T = base.shape[1]
    values = []
    for c in range(0, len(hidings), chunk):
        part = hidings[c : c + chunk]
        bias = torch.zeros(len(part), B, 1, T, T, device=inputs.device)
        for k, (i, keys) in enumerate(part):
            bias[k, :, 0, i, list(keys)] = float("-inf")
        reps = [len(part)] + [1] * (inputs.dim() - 1)
        h = _outputs(model, inputs.repeat(*reps), bias.reshape(len(part) * B, 1, T, T)).reshape(len(part), B, T, -1)
        for k, (i, _) in enumerate(part):
            values.append(float(_change(model, h[k], base, i, head_rows, distribution).mean()))
    return values, 1 + len(hidings)


@torch.no_grad()
def probe_effects(
    model,
    inputs: Tensor,
    rows: list[int] | None = None,
    head_rows: tuple[int, ...] = (0,),
    distribution: bool = False,
    chunk: int = 32,
) -> ProbeEffects:
    """First-order effects of a probe model: hide key ``j`` from query ``i`` (``-inf`` at logit
    ``[i, j]`` in every block and head, on top of the model's own bias) and measure the change
    of query ``i``'s output averaged over ``inputs`` ``(B, ...)`` (tokens or images).

    rows: the queries measured (default: all ``T``); head_rows: rows whose output is the model's
    head (``model.head`` of that row's hidden state: the CLS row of an encoder, every row of a
    GPT); other rows are measured on the final hidden state (:func:`_change`). distribution:
    compare head outputs as softmax distributions (total variation; for classifiers and LMs).
    Returns a ``(T, T)`` effect matrix, nan where not measured (keys the model's own bias
    hides, e.g. the future in a GPT). The passes run on the model's device."""
    start = time.perf_counter()
    model.eval()
    inputs = inputs.to(devices.of(model))
    T = _outputs(model, inputs[:1], None).shape[1]
    rows = list(range(T)) if rows is None else list(rows)
    hidings = _hidings_of(model.base_bias(T), T, rows, pairs=False)
    values, forwards = _hide(model, inputs, hidings, set(head_rows), distribution, chunk)
    effects = np.full((T, T), np.nan)
    for (i, (j,)), v in zip(hidings, values):
        effects[i, j] = v
    return ProbeEffects(effects, forwards, len(inputs), time.perf_counter() - start)


@dataclass
class ProbePairs:
    """Second-order effects of a probe at one query ``row``: ``pair[j, k]`` = change when keys j
    and k are hidden together minus the two single changes (nan: not measured);
    ``single[j]`` the first-order change. forwards/points/seconds as :class:`ProbeEffects`."""

    row: int
    single: np.ndarray
    pair: np.ndarray
    forwards: int
    points: int
    seconds: float


@torch.no_grad()
def probe_pair_effects(
    model,
    inputs: Tensor,
    row: int = 0,
    keys: list[int] | None = None,
    head_rows: tuple[int, ...] = (0,),
    distribution: bool = False,
    chunk: int = 32,
) -> ProbePairs:
    """Second-order effects at query ``row``: for each pair of ``keys`` (default: every key the
    model lets the row see), the change of the row's output when both are hidden minus the
    changes when each is hidden alone. Change is measured as in :func:`probe_effects` (a
    non-negative distance), so an interaction is ``d(j, k) - d(j) - d(k)``: positive when the
    two keys matter more together (a synergy, e.g. a product x_j x_k), near zero when their
    effects add up. The passes run on the model's device."""
    start = time.perf_counter()
    model.eval()
    inputs = inputs.to(devices.of(model))
    T = _outputs(model, inputs[:1], None).shape[1]
    allowed = set(range(T) if keys is None else keys)
    singles = [h for h in _hidings_of(model.base_bias(T), T, [row], pairs=False) if h[1][0] in allowed]
    doubles = [h for h in _hidings_of(model.base_bias(T), T, [row], pairs=True) if set(h[1]) <= allowed]
    values, forwards = _hide(model, inputs, singles + doubles, set(head_rows), distribution, chunk)
    single = np.full(T, np.nan)
    for (_, (j,)), v in zip(singles, values):
        single[j] = v
    pair = np.full((T, T), np.nan)
    for (_, (j, k)), v in zip(doubles, values[len(singles) :]):
        pair[j, k] = pair[k, j] = v - single[j] - single[k]
    return ProbePairs(row, single, pair, forwards, len(inputs), time.perf_counter() - start)


# ----------------------------------------------------------------------------- effects -> structure


def to_structure(
    effects: np.ndarray, threshold: float = 0.1, top_k: int | None = None, self_loops: bool = True
) -> Tensor:
    """``(T, T)`` effects -> ``(T, T)`` structure in {0, 1}.

    ``top_k``: keep each row's ``top_k`` largest effects; otherwise keep entries above
    ``threshold`` times the row's largest effect. Rows with no positive effect keep only
    the diagonal. ``self_loops``: every token reads itself."""
    e = np.nan_to_num(np.asarray(effects, dtype=np.float64), nan=0.0)
    T = e.shape[0]
    s = np.zeros((T, T))
    for i in range(T):
        row = e[i]
        if row.max() <= 0:
            continue
        if top_k is not None:
            keep = np.argsort(-row, kind="stable")[:top_k]
            s[i, keep[row[keep] > 0]] = 1
        else:
            s[i, row > threshold * row.max()] = 1
    if self_loops:
        np.fill_diagonal(s, 1)
    return torch.tensor(s, dtype=torch.float32)


def shuffled(structure: Tensor, seed: int = 0, region: Tensor | None = None) -> Tensor:
    """The control: ``(T, T)`` with the allowed entries inside ``region`` (a ``(T, T)`` bool;
    default: everything off the diagonal) moved to uniformly random places of that region
    (same count: same density); entries outside it are kept. A causal model's region is the
    strictly lower triangle (an entry moved above the diagonal would be masked anyway)."""
    if structure.dim() != 2:
        raise ValueError("shuffled takes one (T, T) structure")
    T = structure.shape[0]
    region = ~torch.eye(T, dtype=torch.bool) if region is None else region.to(torch.bool)
    values = structure[region]
    g = torch.Generator().manual_seed(seed)
    out = structure.clone()
    out[region] = values[torch.randperm(len(values), generator=g)]
    return out


def offset_profile(effects: np.ndarray) -> np.ndarray:
    """``(T, T)`` effects of a causal model -> ``(T,)`` mean effect per query-key offset
    ``d = i - j`` over the measured entries (nan: no measured entry at that offset)."""
    e = np.asarray(effects, dtype=np.float64)
    T = e.shape[0]
    out = np.full(T, np.nan)
    for d in range(T):
        diag = np.diagonal(e, offset=-d)
        if np.isfinite(diag).any():
            out[d] = float(np.nanmean(diag))
    return out


def toeplitz_structure(keep: np.ndarray) -> Tensor:
    """``(T,)`` bool per offset -> ``(T, T)`` causal structure: query i reads key j when
    ``keep[i - j]`` (offset 0, the token itself, always)."""
    keep = np.asarray(keep, dtype=bool).copy()
    keep[0] = True
    T = len(keep)
    i = np.arange(T)
    d = i[:, None] - i[None, :]
    return torch.tensor(np.where(d >= 0, keep[np.clip(d, 0, T - 1)], False), dtype=torch.float32)


def agreement(derived: Tensor, hand: Tensor) -> dict[str, float]:
    """Precision, recall and Jaccard of the allowed (> 0.5) entries of ``derived`` against
    ``hand`` (both ``(T, T)``; the union over heads is taken for ``(H, T, T)``)."""
    d = (derived > 0.5).reshape(-1, *derived.shape[-2:]).any(0)
    h = (hand > 0.5).reshape(-1, *hand.shape[-2:]).any(0)
    tp = int((d & h).sum())
    return {
        "precision": tp / max(1, int(d.sum())),
        "recall": tp / max(1, int(h.sum())),
        "jaccard": tp / max(1, int((d | h).sum())),
        "allowed_derived": int(d.sum()),
        "allowed_hand": int(h.sum()),
    }
