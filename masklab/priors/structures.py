"""Pure builders of prior structure matrices.

A structure is a float tensor in [0, 1] of shape ``(T, T)`` or ``(H, T, T)``: entry
``[i, j] = 1`` means "query i should read key j", 0 means "suppress". A
:class:`~masklab.priors.bias.MaskPrior` turns it into a learnable bias.

Token layout for the CLS encoders (Boolean tasks): position 0 is CLS, position ``i + 1``
holds input variable ``x_i``; ``T = n_vars + 1``.

Interaction *groups* describe the task: tuples of variable indices that must interact
(the monomials of the target), e.g. ``[(0, 1)]`` for 2Parity, ``[(i, i+1, i+2) mod n]``
for Cyclic3.

:data:`DESIGNS` maps a design name to a builder with the uniform signature
``(groups, n_vars, layer, depth, heads) -> (H|1, T, T)``; ``masklab gotu --design NAME``
picks one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from masklab.util.registry import Registry

Groups = Sequence[Sequence[int]]


def cyclic_groups(n_vars: int, k: int) -> list[tuple[int, ...]]:
    """The ``n_vars`` cyclic windows ``(i, i+1, ..., i+k-1) mod n_vars``."""
    return [tuple((i + j) % n_vars for j in range(k)) for i in range(n_vars)]


def support(groups: Groups) -> list[int]:
    """Sorted union of the variables in ``groups``."""
    return sorted({v for g in groups for v in g})


def _validate(groups: Groups, n_vars: int) -> None:
    for g in groups:
        for v in g:
            if not 0 <= v < n_vars:
                raise ValueError(f"variable x{v} is outside 0..{n_vars - 1}")


def support_block(groups: Groups, n_vars: int) -> Tensor:
    """``(T, T)``: variables of a group interact (self included), CLS and the support read
    each other; every other token sees only itself."""
    _validate(groups, n_vars)
    T = n_vars + 1
    s = torch.eye(T)
    for g in groups:
        idx = torch.tensor([v + 1 for v in g])
        s[idx[:, None], idx[None, :]] = 1
    sup = torch.tensor([v + 1 for v in support(groups)])
    s[0, sup] = 1
    s[sup, 0] = 1
    s[0, 0] = 1
    return s


def pairwise(groups: Groups, n_vars: int) -> Tensor:
    """``(T, T)``: strictly pairwise, no self-attention inside the support: a support
    variable reads only the *other* members of its groups (its own value, the linear
    "sum" path, is suppressed); CLS reads the support; other tokens see only themselves.
    For Majority this is the design that suppresses the global-sum shortcut."""
    _validate(groups, n_vars)
    T = n_vars + 1
    s = torch.eye(T)
    sup = torch.tensor([v + 1 for v in support(groups)])
    s[sup, sup] = 0
    for g in groups:
        for a in g:
            for b in g:
                if a != b:
                    s[a + 1, b + 1] = 1
    s[0, sup] = 1
    return s


def readout(groups: Groups, n_vars: int) -> Tensor:
    """``(T, T)``: CLS reads the support; every token (CLS included) also sees itself."""
    _validate(groups, n_vars)
    s = torch.eye(n_vars + 1)
    s[0, torch.tensor([v + 1 for v in support(groups)])] = 1
    return s


def interaction_only(groups: Groups, n_vars: int) -> Tensor:
    """``(T, T)``: the pairwise interaction of :func:`pairwise` with CLS seeing only itself."""
    s = pairwise(groups, n_vars)
    s[0] = 0
    s[0, 0] = 1
    return s


def pairs_per_head(groups: Groups, n_vars: int, heads: int) -> Tensor:
    """``(H, T, T)``: head ``h`` carries one ordered pair ``(a -> b)`` of a group (cycling
    through all pairs), so each support token reads exactly one partner per head;
    CLS reads the support in every head; tokens also see themselves."""
    _validate(groups, n_vars)
    pairs = [(a, b) for g in groups for a in g for b in g if a != b]
    if not pairs:
        raise ValueError("per-head design needs groups of at least two variables")
    s = torch.eye(n_vars + 1).repeat(heads, 1, 1)
    for i, (a, b) in enumerate(pairs):
        s[i % heads, a + 1, b + 1] = 1
    s[:, 0, torch.tensor([v + 1 for v in support(groups)])] = 1
    return s


# ----------------------------------------------------------------------------- metrics


def allowed_mass(probs: Tensor, structure: Tensor, rows: str = "cls") -> float:
    """Attention mass on allowed keys.

    probs: ``(B, H, T, T)``; structure: ``(H|1, T, T)`` in [0, 1] (> 0.5 = allowed).
    ``rows="cls"`` averages the CLS query (row 0) over batch and heads; ``"all"`` every row.
    """
    allowed = (structure > 0.5).to(probs.device, probs.dtype)
    mass = (probs * allowed).sum(-1)  # (B, H, T)
    return (mass[..., 0] if rows == "cls" else mass).mean().item()


Design = Callable[[Groups, int, int, int, int], Tensor]
DESIGNS: Registry[Design] = Registry(
    "prior design",
    items={
        # one pattern for every layer and head
        "support-block": lambda g, n, layer, depth, heads: support_block(g, n),
        "pairwise": lambda g, n, layer, depth, heads: pairwise(g, n),
        # interact first (CLS idle), read out in the last layer
        "layer-specific": lambda g, n, layer, depth, heads: (
            interaction_only(g, n) if layer < depth - 1 else readout(g, n)
        ),
        "per-head": lambda g, n, layer, depth, heads: pairs_per_head(g, n, heads),
    },
)


def design_structure(name: str, groups: Groups, n_vars: int, layer: int, depth: int, heads: int) -> Tensor:
    """Structure of design ``name`` for one layer: ``(H|1, T, T)``."""
    s = DESIGNS[name](groups, n_vars, layer, depth, heads)
    return s if s.dim() == 3 else s[None]


# ----------------------------------------------------------------------------- vision and language
# Builders for Study A's vision and language tables (issue 7). Token layout for a ViT:
# position 0 is CLS, position ``1 + r * grid + c`` is the patch in row r, column c of a
# ``grid x grid`` patch grid; ``T = grid * grid + 1``.

#: Relative offsets (d_row, d_col) of a 3x3 convolution impulse, centre first.
IMPULSE_OFFSETS: tuple[tuple[int, int], ...] = (
    (0, 0),
    (0, 1),
    (1, 0),
    (0, -1),
    (-1, 0),
    (1, 1),
    (-1, -1),
    (1, -1),
    (-1, 1),
)


def _grid_coords(grid: int) -> Tensor:
    """``(grid * grid, 2)`` (row, col) of each patch in token order."""
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    return torch.stack([rows.flatten(), cols.flatten()], dim=1)


def _with_cls(patch: Tensor) -> Tensor:
    """Embed a ``(H, P, P)`` patch-to-patch structure into ``(H, P+1, P+1)`` with CLS
    unconstrained (CLS reads every token, every token reads CLS)."""
    H, P, _ = patch.shape
    s = torch.ones(H, P + 1, P + 1)
    s[:, 1:, 1:] = patch
    return s


def offset_2d(grid: int, offset: tuple[int, int]) -> Tensor:
    """``(P, P)`` with ``P = grid**2``: patch (r, c) reads patch (r + dr, c + dc), clamped to
    the grid (replicate padding, so every query has exactly one allowed patch)."""
    xy = _grid_coords(grid)
    target = (xy + torch.tensor(offset)).clamp(0, grid - 1)
    s = torch.zeros(grid * grid, grid * grid)
    s[torch.arange(grid * grid), target[:, 0] * grid + target[:, 1]] = 1.0
    return s


def neighbourhood_2d(grid: int, radius: int = 1) -> Tensor:
    """``(P, P)``: patch (r, c) reads every patch within Chebyshev distance ``radius``."""
    xy = _grid_coords(grid)
    dist = (xy[:, None, :] - xy[None, :, :]).abs().amax(-1)
    return (dist <= radius).float()


def impulse_2d(grid: int, heads: int) -> Tensor:
    """``(H, T, T)``: head h is a convolution impulse at offset ``IMPULSE_OFFSETS[h % 9]``
    over the patch grid; CLS unconstrained. The target pattern of the ``impulse`` init."""
    patch = torch.stack([offset_2d(grid, IMPULSE_OFFSETS[h % len(IMPULSE_OFFSETS)]) for h in range(heads)])
    return _with_cls(patch)


def locality_2d(grid: int, heads: int, radius: int = 1) -> Tensor:
    """``(H, T, T)``: the 2-D locality mask prior. Head 0 reads its ``radius`` neighbourhood;
    head h >= 1 prefers the relative offset ``IMPULSE_OFFSETS[h % 9]`` (its own patch for
    h = 9, 18, ...) and may also read itself; CLS unconstrained."""
    eye = torch.eye(grid * grid)
    patch = [neighbourhood_2d(grid, radius)]
    for h in range(1, heads):
        patch.append(torch.maximum(offset_2d(grid, IMPULSE_OFFSETS[h % len(IMPULSE_OFFSETS)]), eye))
    return _with_cls(torch.stack(patch))


def relative_distance(seq: int, heads: int, widths: Sequence[float] | None = None) -> Tensor:
    """``(H, T, T)`` causal relative-distance structure: ``S[h, i, j] = 2 ** (-(i - j) / w_h)``
    for ``j <= i`` (1 on the diagonal, decreasing with distance), 0 above the diagonal.

    Widths default to a geometric ladder from 1 to ``seq`` (one short-range head, one
    nearly uniform head), the way ALiBi spreads its slopes."""
    if widths is None:
        widths = [seq ** (h / max(1, heads - 1)) for h in range(heads)]
    if len(widths) != heads:
        raise ValueError(f"need one width per head: got {len(widths)} for {heads} heads")
    i = torch.arange(seq)
    dist = (i[:, None] - i[None, :]).float()  # (T, T), query minus key
    w = torch.as_tensor(widths, dtype=torch.float32)[:, None, None]
    s = torch.pow(2.0, -dist.clamp_min(0)[None] / w)
    return s.masked_fill((dist < 0)[None], 0.0)


# ============================================================================ digit alignment
# Priors for the arithmetic study (3-digit addition / multiplication, masklab.lab.studies.arith).
#
# Sequence layout for operand width ``n`` and result width ``r`` (``n + 1`` for addition,
# ``2 n`` for multiplication), one token per character, operands most significant digit first:
#
#     a_{n-1} .. a_0  op  b_{n-1} .. b_0  =  result (r digits; plain: MSB first, reversed: LSB first)
#     0      .. n-1   n   n+1    ..  2n   2n+1  2n+2 .. 2n+1+r-1
#
# The decoder reads every token but the last (``T = 2n + 1 + r`` positions) and the query at
# position ``2n + 1 + t`` emits the ``t``-th written result digit (the "=" emits the first one).
# A structure row for such an *emitting* query allows the operand digits that determine that
# result digit, plus the query itself (which holds the previous result digit); every other
# query sees only itself. Structures are always combined with the causal mask (nothing above
# the diagonal); the GPT adds its hard causal bias on top.


def arith_seq_len(width: int, op: str) -> int:
    """Decoder input length ``T = 2 width + 1 + result_width`` for ``op`` in {"add", "mul"}."""
    return 2 * width + 1 + result_width(width, op)


def result_width(width: int, op: str) -> int:
    """Digits of the fixed-width result: ``width + 1`` (add) or ``2 width`` (mul)."""
    if op == "add":
        return width + 1
    if op == "mul":
        return 2 * width
    raise ValueError(f"unknown arithmetic op {op!r}; choose add or mul")


def operand_position(width: int, operand: int, place: int) -> int:
    """Sequence position of digit ``place`` (0 = units) of operand 0 (a) or 1 (b)."""
    if not 0 <= place < width:
        raise ValueError(f"place {place} is outside 0..{width - 1}")
    return (width - 1 - place) if operand == 0 else (2 * width - place)


def emitting_position(width: int, op: str, place: int, reverse: bool) -> int:
    """Position of the query that emits the result digit of value ``10**place``."""
    r = result_width(width, op)
    if not 0 <= place < r:
        raise ValueError(f"result place {place} is outside 0..{r - 1}")
    written = place if reverse else r - 1 - place
    return 2 * width + 1 + written


def causal(structure: Tensor) -> Tensor:
    """``(…, T, T)`` structure with everything above the diagonal cleared (query i reads keys <= i)."""
    T = structure.shape[-1]
    return structure * torch.ones(T, T).tril()


def _alignment(width: int, op: str, reverse: bool, keys_of_place) -> Tensor:
    T = arith_seq_len(width, op)
    s = torch.eye(T)
    for place in range(result_width(width, op)):
        row = emitting_position(width, op, place, reverse)
        for operand, digit in keys_of_place(place):
            s[row, operand_position(width, operand, digit)] = 1
    return causal(s)


def addition_alignment(width: int, reverse: bool = False) -> Tensor:
    """``(T, T)`` digit alignment for ``a + b`` (``T = 3 width + 2``): the query emitting result
    place ``p`` reads ``a_p, b_p`` (its place) and ``a_{p-1}, b_{p-1}`` (the place below, whose
    carry it needs), where those digits exist, and itself; other queries read only themselves."""

    def keys(p: int) -> list[tuple[int, int]]:
        return [(o, d) for d in (p, p - 1) if 0 <= d < width for o in (0, 1)]

    return _alignment(width, "add", reverse, keys)


def multiplication_alignment(width: int, reverse: bool = False, window: int | None = None) -> Tensor:
    """``(T, T)`` digit alignment for ``a * b`` (``T = 4 width + 1``): the query emitting result
    place ``k`` reads every operand digit ``a_i`` / ``b_j`` that appears in a partial product
    ``a_i b_j`` with ``k - window <= i + j <= k``, and itself. ``window=None`` (default) takes
    every ``i + j <= k``: all partial products that can affect digit ``k`` through carries;
    ``window=0`` only the place's own products ``i + j = k``."""
    if window is not None and window < 0:
        raise ValueError("window must be >= 0 or None")

    def keys(k: int) -> list[tuple[int, int]]:
        lo = 0 if window is None else k - window
        pairs = [(i, j) for i in range(width) for j in range(width) if lo <= i + j <= k]
        return sorted({(0, i) for i, _ in pairs} | {(1, j) for _, j in pairs})

    return _alignment(width, "mul", reverse, keys)


def split_heads(structure: Tensor, heads: int) -> Tensor:
    """``(T, T)`` -> ``(H, T, T)``: one alignment pattern per head. Each query keeps itself in
    every head; its other allowed keys (in position order) go round-robin to heads 0, 1, …,
    so with 4 heads an addition query reads ``a_p``, ``a_{p-1}``, ``b_p``, ``b_{p-1}`` in one
    head each. The union over heads is the shared structure."""
    if structure.dim() != 2:
        raise ValueError("split_heads takes one shared (T, T) structure")
    T = structure.shape[0]
    out = torch.eye(T).repeat(heads, 1, 1)
    for q in range(T):
        keys = [k for k in range(T) if k != q and structure[q, k] > 0.5]
        for m, k in enumerate(keys):
            out[m % heads, q, k] = 1
    return out


ARITH_PRIORS = ("shared", "per-head")


def arith_structure(
    op: str, width: int, reverse: bool = False, variant: str = "shared", heads: int = 1, window: int | None = None
) -> Tensor:
    """The digit-alignment structure of ``op`` for one layer: ``(1, T, T)`` ("shared") or
    ``(H, T, T)`` ("per-head"), causal."""
    if op == "add":
        s = addition_alignment(width, reverse)
    elif op == "mul":
        s = multiplication_alignment(width, reverse, window)
    else:
        raise ValueError(f"unknown arithmetic op {op!r}; choose add or mul")
    if variant == "shared":
        return s[None]
    if variant == "per-head":
        return split_heads(s, heads)
    raise ValueError(f"unknown prior variant {variant!r}; choose one of {ARITH_PRIORS}")
