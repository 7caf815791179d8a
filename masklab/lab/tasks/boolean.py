"""Boolean "generalisation on the unseen" (GOTU) tasks (Abbe et al., ICML 2023).

Inputs are ``x in {-1, +1}^n``; all ``2^n`` points are enumerated. A task has a target
``f``, a *seen* (training) domain and its complement, the *unseen* domain, plus the
interaction groups a prior may use. Built-in tasks (``n = 15``):

==========  ===============================  ===========================  ===================
name        target                           seen domain                  unseen domain
==========  ===============================  ===========================  ===================
2parity     x0*x1                            x0 == 1 or x1 == 1 (24576)   x0 == x1 == -1
maj3        sign(x0 + x1 + x2)               x0 == 1 or x1 == 1           x0 == x1 == -1
cyclic3     sum_i x_i x_{i+1} x_{i+2} mod n  x0 == 1 or x1 == 1 or x2==1  x0 == x1 == x2 == -1
==========  ===============================  ===========================  ===================

Custom tasks come from expressions (``--function "x0*x1*x2" --seen "x0==1 or x1==1"``)
parsed with :mod:`ast` and interpreted on numpy arrays against a whitelist: never ``eval``.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from masklab.util.errors import MasklabError
from masklab.priors.structures import cyclic_groups

DIM = 15


def cube(n: int) -> np.ndarray:
    """All ``2^n`` points of ``{-1, +1}^n`` as a ``(2^n, n)`` int8 array (row r = bits of r)."""
    if not 1 <= n <= 20:
        raise MasklabError(f"dimension must be between 1 and 20, got {n}")
    bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    return (2 * bits - 1).astype(np.int8)


@dataclass
class BooleanTask:
    """A GOTU task on the full cube.

    Attributes:
        x: ``(P, n)`` int8 in {-1, +1}, all points.
        y: ``(P,)`` float32 target values.
        seen: ``(P,)`` bool, the training domain.
        groups: interaction groups (variable index tuples) for the mask prior.
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    seen: np.ndarray
    groups: list[tuple[int, ...]]
    default_design: str = "support-block"

    @property
    def dim(self) -> int:
        return self.x.shape[1]

    @property
    def unseen(self) -> np.ndarray:
        return ~self.seen


# ----------------------------------------------------------------------------- expressions

_BINOPS = {
    ast.Add: np.add,
    ast.Sub: np.subtract,
    ast.Mult: np.multiply,
    ast.Div: np.true_divide,
    ast.Mod: np.mod,
}
_CMPS = {
    ast.Eq: np.equal,
    ast.NotEq: np.not_equal,
    ast.Lt: np.less,
    ast.LtE: np.less_equal,
    ast.Gt: np.greater,
    ast.GtE: np.greater_equal,
}
_FUNCS: dict[str, Callable[..., np.ndarray]] = {
    "sign": np.sign,
    "abs": np.abs,
    "min": lambda *a: np.minimum.reduce(np.broadcast_arrays(*a)),
    "max": lambda *a: np.maximum.reduce(np.broadcast_arrays(*a)),
}


def parse_expression(source: str, dim: int) -> Callable[[np.ndarray], np.ndarray]:
    """Compile an expression over ``x0..x{dim-1}`` into a function of a ``(P, dim)`` array.

    Allowed: numbers, variables ``x<i>``, ``+ - * / %``, ``**`` with a small non-negative
    integer exponent, unary ``- + not``, comparisons (chains too), ``and``/``or``,
    ``a if c else b``, and calls to ``sign``, ``abs``, ``min``, ``max``. Anything else
    raises :class:`MasklabError` naming the offending part.
    """
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as e:
        raise MasklabError(f"cannot parse expression {source!r}: {e.msg}") from None

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            if not (node.id.startswith("x") and node.id[1:].isdigit()) and node.id not in _FUNCS:
                raise MasklabError(f"unknown name {node.id!r} in {source!r}; use x0..x{dim - 1}")
            if node.id not in _FUNCS and int(node.id[1:]) >= dim:
                raise MasklabError(
                    f"variable {node.id} is out of range in {source!r}; dimension is {dim} (x0..x{dim - 1})"
                )
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS or node.keywords:
                raise MasklabError(f"only calls to {sorted(_FUNCS)} are allowed in {source!r}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            if not (
                isinstance(node.right, ast.Constant)
                and isinstance(node.right.value, int)
                and 0 <= node.right.value <= 16
            ):
                raise MasklabError(f"'**' needs an integer exponent 0..16 in {source!r}")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float)) or isinstance(node.value, bool):
                raise MasklabError(f"only numeric constants are allowed in {source!r}")
        elif not isinstance(
            node,
            (
                ast.Expression,
                ast.BinOp,
                ast.UnaryOp,
                ast.BoolOp,
                ast.Compare,
                ast.IfExp,
                ast.Load,
                ast.operator,
                ast.unaryop,
                ast.boolop,
                ast.cmpop,
            ),
        ):
            raise MasklabError(f"{type(node).__name__} is not allowed in {source!r}")
        if isinstance(node, ast.BinOp) and not isinstance(node.op, (ast.Pow, *_BINOPS)):
            raise MasklabError(f"operator {type(node.op).__name__} is not allowed in {source!r}")
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            raise MasklabError(f"operator {type(node.op).__name__} is not allowed in {source!r}")
        if isinstance(node, ast.Compare) and not all(type(op) in _CMPS for op in node.ops):
            raise MasklabError(f"comparison not allowed in {source!r}")
        for child in ast.iter_child_nodes(node):
            check(child)

    check(tree)

    def run(node: ast.AST, x: np.ndarray) -> np.ndarray:
        if isinstance(node, ast.Expression):
            return run(node.body, x)
        if isinstance(node, ast.Constant):
            return np.asarray(node.value, dtype=np.float64)
        if isinstance(node, ast.Name):
            return x[:, int(node.id[1:])].astype(np.float64)
        if isinstance(node, ast.BinOp):
            a, b = run(node.left, x), run(node.right, x)
            if isinstance(node.op, ast.Pow):
                return np.power(a, int(node.right.value))
            with np.errstate(divide="ignore", invalid="ignore"):
                return _BINOPS[type(node.op)](a, b)
        if isinstance(node, ast.UnaryOp):
            v = run(node.operand, x)
            if isinstance(node.op, ast.Not):
                return np.logical_not(v)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BoolOp):
            vals = [np.asarray(run(v, x), dtype=bool) for v in node.values]
            op = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            return op.reduce(np.broadcast_arrays(*vals))
        if isinstance(node, ast.Compare):
            left, result = run(node.left, x), None
            for op, comp in zip(node.ops, node.comparators):
                right = run(comp, x)
                r = _CMPS[type(op)](left, right)
                result = r if result is None else np.logical_and(result, r)
                left = right
            return result
        if isinstance(node, ast.IfExp):
            return np.where(np.asarray(run(node.test, x), dtype=bool), run(node.body, x), run(node.orelse, x))
        if isinstance(node, ast.Call):
            return _FUNCS[node.func.id](*[run(a, x) for a in node.args])
        raise MasklabError(f"unsupported expression part {type(node).__name__}")  # unreachable after check()

    def fn(x: np.ndarray) -> np.ndarray:
        return np.broadcast_to(run(tree, x), (x.shape[0],))

    return fn


def custom_task(function: str, seen: str, support: list[int], dim: int = DIM, name: str = "custom") -> BooleanTask:
    """A task from expressions: ``function`` gives the target, ``seen`` the training domain,
    ``support`` the variables the prior lets interact (one group)."""
    x = cube(dim)
    y = parse_expression(function, dim)(x).astype(np.float64)
    if not np.all(np.isfinite(y)):
        raise MasklabError(f"function {function!r} is not finite on every point of the cube")
    seen_mask = np.asarray(parse_expression(seen, dim)(x))
    if seen_mask.dtype != bool:
        raise MasklabError(f"--seen {seen!r} must be a condition (comparisons, and/or), not a number")
    if seen_mask.all():
        raise MasklabError(f"--seen {seen!r} covers the whole cube: the unseen domain is empty")
    if not seen_mask.any():
        raise MasklabError(f"--seen {seen!r} is empty: no training points")
    if not support:
        raise MasklabError("--support needs at least one variable index, e.g. --support 0,1,2")
    for v in support:
        if not 0 <= v < dim:
            raise MasklabError(f"--support index {v} is outside 0..{dim - 1}")
    return BooleanTask(name, x, y.astype(np.float32), seen_mask, [tuple(sorted(set(support)))])


def make_task(name: str, dim: int = DIM) -> BooleanTask:
    """One of the built-in tasks ``2parity``, ``maj3``, ``cyclic3``."""
    x = cube(dim)
    xf = x.astype(np.float32)
    if name == "2parity":
        return BooleanTask(name, x, xf[:, 0] * xf[:, 1], (x[:, 0] == 1) | (x[:, 1] == 1), [(0, 1)])
    if name == "maj3":
        y = np.sign(xf[:, 0] + xf[:, 1] + xf[:, 2])
        return BooleanTask(name, x, y, (x[:, 0] == 1) | (x[:, 1] == 1), [(0, 1, 2)], "pairwise")
    if name == "cyclic3":
        groups = cyclic_groups(dim, 3)
        y = sum(xf[:, a] * xf[:, b] * xf[:, c] for a, b, c in groups)
        return BooleanTask(name, x, y, (x[:, 0] == 1) | (x[:, 1] == 1) | (x[:, 2] == 1), groups)
    raise MasklabError(f"unknown task {name!r}; choose one of {TASKS} or give --function/--seen/--support")


TASKS = ("2parity", "maj3", "cyclic3")


# ----------------------------------------------------------------------------- analysis


def monomials(groups: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Every subset of every group (deduplicated, sorted by degree): the monomials whose
    Fourier coefficients a run reports."""
    subsets = {tuple(sorted(s)) for g in groups for r in range(len(g) + 1) for s in itertools.combinations(g, r)}
    return sorted(subsets, key=lambda s: (len(s), s))


def monomial_name(s: tuple[int, ...]) -> str:
    return "*".join(f"x{i}" for i in s) if s else "1"


def fourier(x: np.ndarray, values: np.ndarray, subsets: list[tuple[int, ...]]) -> dict[str, float]:
    """Fourier-Walsh coefficients ``E_x[f(x) prod_{i in S} x_i]`` over the full cube."""
    xf = x.astype(np.float64)
    return {monomial_name(s): float(np.mean(values * np.prod(xf[:, list(s)], axis=1))) for s in subsets}


def minimum_degree_interpolator(task: BooleanTask, max_vars: int = 20) -> np.ndarray:
    """Values on the whole cube of the minimum-degree interpolator (MDI) of the target on
    the seen domain, over the monomials of the variables in the task's groups: the
    least-squares (minimum-norm) fit with monomials of degree <= d, for the smallest d
    that interpolates exactly. ``(P,)`` float."""
    variables = sorted({v for g in task.groups for v in g})
    if len(variables) > max_vars:
        raise MasklabError("too many support variables for the MDI analysis")
    xf = task.x.astype(np.float64)
    for d in range(len(variables) + 1):
        cols = [s for r in range(d + 1) for s in itertools.combinations(variables, r)]
        A = np.stack([np.prod(xf[:, list(s)], axis=1) for s in cols], axis=1)  # (P, M)
        coef, *_ = np.linalg.lstsq(A[task.seen], task.y[task.seen].astype(np.float64), rcond=None)
        if np.max(np.abs(A[task.seen] @ coef - task.y[task.seen])) < 1e-6:
            return A @ coef
    raise MasklabError("the target is not a function of the support variables; cannot compute the MDI")
