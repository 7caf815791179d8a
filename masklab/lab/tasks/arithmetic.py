"""Fixed-width integer addition and multiplication as next-token prediction.

Every operand pair ``(a, b)`` with ``0 <= a, b < 10**width`` is one example; pair index
``i = a * 10**width + b`` enumerates the ``10**(2 width)`` pairs. A split draws
``train + test`` distinct indices without replacement from one seeded generator: the first
``train`` are the training set, the rest the held-out test set, so the two never overlap.

Sequences use the layout of :mod:`masklab.priors.structures` (digit-alignment section)::

    a (width digits, MSB first)  op  b (width digits)  =  result (fixed width; LSB first if reversed)

e.g. width 3, addition, plain: ``0 4 2 + 9 5 8 = 1 0 0 0`` (vocabulary: digits 0-9, ``+``,
``*``, ``=``). The decoder reads ``seq[:, :-1]`` and is trained to predict ``seq[:, 1:]`` on the
result positions only (prompt targets are ``IGNORE``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from masklab.util.errors import MasklabError
from masklab.priors.structures import result_width

PLUS, TIMES, EQUALS = 10, 11, 12
VOCAB = 13
IGNORE = -100
OPS = ("add", "mul")
WIDTHS = range(2, 6)


def _check(op: str, width: int) -> None:
    if op not in OPS:
        raise MasklabError(f"unknown operation {op!r}; choose one of {', '.join(OPS)}")
    if width not in WIDTHS:
        raise MasklabError(f"operand width must be between {WIDTHS[0]} and {WIDTHS[-1]} digits, got {width}")


def n_pairs(width: int) -> int:
    """Number of operand pairs: ``10**(2 width)``."""
    return 10 ** (2 * width)


def digits(x: np.ndarray, width: int) -> np.ndarray:
    """Non-negative ints ``(P,)`` -> their ``width`` digits, MSB first: ``(P, width)`` int64."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return (np.asarray(x, dtype=np.int64)[:, None] // powers) % 10


def encode(index: np.ndarray, op: str, width: int, reverse: bool = False) -> Tensor:
    """Pair indices ``(P,)`` -> full token sequences ``(P, 2 width + 2 + result_width)`` int64."""
    _check(op, width)
    index = np.asarray(index, dtype=np.int64)
    base = 10**width
    a, b = index // base, index % base
    value = a + b if op == "add" else a * b
    res = digits(value, result_width(width, op))
    if reverse:
        res = res[:, ::-1]
    P = len(index)
    sign = np.full((P, 1), PLUS if op == "add" else TIMES)
    eq = np.full((P, 1), EQUALS)
    seq = np.concatenate([digits(a, width), sign, digits(b, width), eq, res], axis=1)
    return torch.from_numpy(np.ascontiguousarray(seq))


def prompt_len(width: int) -> int:
    """Tokens before the result: ``2 width + 2`` (operands, sign and ``=``)."""
    return 2 * width + 2


def inputs_targets(seq: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Teacher forcing: ``(P, L)`` -> inputs ``seq[:, :-1]`` and targets ``seq[:, 1:]`` with the
    prompt's targets set to ``IGNORE`` (the loss is on result digits only)."""
    x, y = seq[:, :-1], seq[:, 1:].clone()
    y[:, : prompt_len(width) - 1] = IGNORE
    return x, y


@dataclass
class Split:
    """A seeded training/test split of the operand pairs (pair indices, disjoint)."""

    op: str
    width: int
    reverse: bool
    train: np.ndarray  # (n_train,) pair indices
    test: np.ndarray  # (n_test,) pair indices

    def sequences(self, which: str) -> Tensor:
        return encode(self.train if which == "train" else self.test, self.op, self.width, self.reverse)


def train_count(fraction: float, width: int) -> int:
    """Training pairs for a fraction of the ``10**(2 width)`` pairs (rounded, at least 1)."""
    if not 0 < fraction < 1:
        raise MasklabError(f"training fraction must lie in (0, 1), got {fraction}")
    return max(1, round(fraction * n_pairs(width)))


def make_split(op: str, width: int, fraction: float, test_size: int, seed: int, reverse: bool = False) -> Split:
    """Draw ``train_count(fraction)`` training and ``test_size`` test pairs without replacement."""
    _check(op, width)
    n_train = train_count(fraction, width)
    if test_size < 1:
        raise MasklabError(f"test set size must be positive, got {test_size}")
    if n_train + test_size > n_pairs(width):
        raise MasklabError(
            f"{n_train} training + {test_size} test pairs exceed the {n_pairs(width)} pairs of width {width}; "
            "lower --fraction or --test-size"
        )
    rng = np.random.default_rng([seed, width, OPS.index(op)])
    idx = rng.choice(n_pairs(width), n_train + test_size, replace=False)
    return Split(op, width, reverse, idx[:n_train], idx[n_train:])


@torch.no_grad()
def greedy_results(model, seq: Tensor, width: int, chunk: int = 2000) -> Tensor:
    """Greedy decoding of the result from the prompt: ``(P, L)`` -> predicted result ``(P, r)``."""
    p = prompt_len(width)
    r = seq.shape[1] - p
    dev = next(model.parameters()).device  # prompts go to the model's device, results come back to the CPU
    out = [model.generate(seq[i : i + chunk, :p].to(dev), r)[:, p:].cpu() for i in range(0, len(seq), chunk)]
    return torch.cat(out) if out else seq[:, p:]


def score(pred: Tensor, seq: Tensor, width: int) -> dict:
    """Exact-sequence and per-digit accuracy of predicted results ``(P, r)`` against ``seq``.

    Returns ``{"exact_acc", "digit_acc", "digit_acc_by_position"}`` (positions in written order)."""
    truth = seq[:, prompt_len(width) :]
    ok = pred == truth  # (P, r)
    return {
        "exact_acc": ok.all(1).float().mean().item(),
        "digit_acc": ok.float().mean().item(),
        "digit_acc_by_position": ok.float().mean(0).tolist(),
    }
