"""Boolean GOTU tasks: split sizes, targets, the safe expression parser, analysis helpers."""

import numpy as np
import pytest

from masklab.lab.runner import MasklabError
from masklab.lab.tasks.boolean import (
    custom_task,
    fourier,
    make_task,
    minimum_degree_interpolator,
    monomials,
    parse_expression,
)


@pytest.mark.parametrize(
    "name,seen,unseen", [("2parity", 24576, 8192), ("maj3", 24576, 8192), ("cyclic3", 28672, 4096)]
)
def test_split_sizes(name, seen, unseen):
    t = make_task(name)
    assert t.x.shape == (32768, 15)
    assert len(np.unique(t.x, axis=0)) == 32768
    assert t.seen.sum() == seen and t.unseen.sum() == unseen


def test_targets():
    t = make_task("2parity")
    assert np.all(t.y == t.x[:, 0] * t.x[:, 1])
    assert np.all(t.y[t.unseen] == 1)
    m = make_task("maj3")
    assert set(np.unique(m.y)) == {-1.0, 1.0}
    c = make_task("cyclic3")
    i = 7
    assert c.y[i] == sum(c.x[i, a] * c.x[i, (a + 1) % 15] * c.x[i, (a + 2) % 15] for a in range(15))


def test_mdi_of_2parity_is_minus_one_plus_x0_plus_x1():
    t = make_task("2parity")
    mdi = minimum_degree_interpolator(t)
    coef = fourier(t.x, mdi, monomials(t.groups))
    assert coef == pytest.approx({"1": -1.0, "x0": 1.0, "x1": 1.0, "x0*x1": 0.0}, abs=1e-9)
    assert np.allclose(mdi[t.unseen], -3.0)


def test_parser_matches_builtin_and_handles_logic():
    x = make_task("2parity", 4).x
    f = parse_expression("x0*x1*x2", 4)
    assert np.array_equal(f(x), x[:, 0] * x[:, 1] * x[:, 2])
    seen = parse_expression("x0==1 or not (x1 != 1)", 4)(x)
    assert np.array_equal(seen, (x[:, 0] == 1) | (x[:, 1] == 1))
    assert np.array_equal(parse_expression("sign(x0+x1+x2)", 4)(x), np.sign(x[:, :3].sum(1)))
    assert np.array_equal(parse_expression("1 if x0 > 0 else -1", 4)(x), x[:, 0])
    assert np.array_equal(parse_expression("x3**2", 4)(x), np.ones(16))


@pytest.mark.parametrize(
    "expr,msg",
    [
        ("__import__('os').system('true')", "only calls"),
        ("x0.real", "Attribute"),
        ("x15", "out of range"),
        ("y0 * x1", "unknown name"),
        ("x0 *", "cannot parse"),
        ("[x0]", "List"),
        ("'a'", "numeric"),
        ("x0 ** x1", "integer exponent"),
        ("lambda: 1", "Lambda"),
    ],
)
def test_parser_rejects_everything_else(expr, msg):
    with pytest.raises(MasklabError, match=msg):
        parse_expression(expr, 15)


def test_custom_task_errors():
    with pytest.raises(MasklabError, match="unseen domain is empty"):
        custom_task("x0", "x0 == x0", [0], 4)
    with pytest.raises(MasklabError, match="no training points"):
        custom_task("x0", "x0 == 2", [0], 4)
    with pytest.raises(MasklabError, match="must be a condition"):
        custom_task("x0", "x0 + 1", [0], 4)
    with pytest.raises(MasklabError, match="outside"):
        custom_task("x0", "x0 == 1", [9], 4)
    t = custom_task("x0*x1*x2", "x0==1 or x1==1", [0, 1, 2], 6)
    assert t.seen.sum() == 48 and t.groups == [(0, 1, 2)]
