"""Arithmetic study: data generation, digit-alignment priors, decoding, QK step-0 match, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from masklab.priors.bias import MaskPrior
from masklab.util import flags
from masklab.cli import build_parser, main
from masklab.models import GPT
from masklab.priors.qk_init import QK_INITS
from masklab.priors.structures import allowed_mass
from masklab.lab.runner import MasklabError
from masklab.priors.structures import (
    addition_alignment,
    arith_seq_len,
    arith_structure,
    emitting_position,
    multiplication_alignment,
    operand_position,
    split_heads,
)
from masklab.lab.studies import arith
from masklab.lab.tasks.arithmetic import (
    EQUALS,
    IGNORE,
    PLUS,
    TIMES,
    VOCAB,
    encode,
    greedy_results,
    inputs_targets,
    make_split,
    prompt_len,
    score,
    train_count,
)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one torch thread is faster, and the machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------- data


def idx(a: int, b: int, width: int = 3) -> int:
    return a * 10**width + b


def test_encode_plain_and_reversed():
    seq = encode(np.array([idx(42, 958)]), "add", 3)
    assert seq[0].tolist() == [0, 4, 2, PLUS, 9, 5, 8, EQUALS, 1, 0, 0, 0]
    rev = encode(np.array([idx(42, 958)]), "add", 3, reverse=True)
    assert rev[0].tolist() == [0, 4, 2, PLUS, 9, 5, 8, EQUALS, 0, 0, 0, 1]
    mul = encode(np.array([idx(999, 999), idx(7, 3)]), "mul", 3)
    assert mul[0].tolist() == [9, 9, 9, TIMES, 9, 9, 9, EQUALS, 9, 9, 8, 0, 0, 1]
    assert mul[1].tolist() == [0, 0, 7, TIMES, 0, 0, 3, EQUALS, 0, 0, 0, 0, 2, 1]


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("reverse", [False, True])
def test_layout_positions_match_encoding(op, reverse):
    """The structures' position helpers point at the right tokens of the encoded sequence."""
    width = 3
    a, b = 507, 86
    seq = encode(np.array([idx(a, b)]), op, width, reverse)[0]
    x, y = inputs_targets(seq[None], width)
    assert x.shape[1] == arith_seq_len(width, op)
    value = a + b if op == "add" else a * b
    for place in range(width):
        assert seq[operand_position(width, 0, place)] == (a // 10**place) % 10
        assert seq[operand_position(width, 1, place)] == (b // 10**place) % 10
    r = width + 1 if op == "add" else 2 * width
    for place in range(r):
        # the query at the emitting position is trained to predict the digit of that place
        assert y[0, emitting_position(width, op, place, reverse)] == (value // 10**place) % 10


def test_inputs_targets_ignore_the_prompt():
    seq = encode(np.array([idx(1, 2), idx(3, 4)]), "add", 3)
    x, y = inputs_targets(seq, 3)
    assert x.shape == y.shape == (2, 11)
    assert (y[:, : prompt_len(3) - 1] == IGNORE).all()
    assert (y[:, prompt_len(3) - 1 :] == seq[:, prompt_len(3) :]).all()


def test_split_exact_counts_and_no_overlap():
    s = make_split("add", 3, 0.004, 10_000, seed=0)
    assert len(s.train) == 4000 == train_count(0.004, 3)
    assert len(s.test) == 10_000
    both = np.concatenate([s.train, s.test])
    assert len(np.unique(both)) == len(both)  # drawn without replacement, disjoint
    assert both.min() >= 0 and both.max() < 10**6
    # seeded: same seed same split, another seed another split
    assert np.array_equal(make_split("add", 3, 0.004, 10_000, seed=0).train, s.train)
    assert not np.array_equal(make_split("add", 3, 0.004, 10_000, seed=1).train, s.train)
    # the sequences decode back to the pairs they came from
    seq = s.sequences("test")[:50]
    a = (seq[:, :3] * torch.tensor([100, 10, 1])).sum(1)
    b = (seq[:, 4:7] * torch.tensor([100, 10, 1])).sum(1)
    assert (a * 1000 + b).tolist() == s.test[:50].tolist()


def test_split_rejects_impossible_sizes():
    with pytest.raises(MasklabError, match="exceed"):
        make_split("add", 2, 0.5, 6000, seed=0)  # 5000 + 6000 > 10^4 pairs
    with pytest.raises(MasklabError, match="fraction"):
        make_split("add", 3, 1.5, 100, seed=0)
    with pytest.raises(MasklabError, match="width"):
        make_split("add", 6, 0.001, 100, seed=0)
    with pytest.raises(MasklabError, match="operation"):
        make_split("div", 3, 0.001, 100, seed=0)


def test_width_five_split_is_cheap_and_disjoint():
    s = make_split("mul", 5, 1e-6, 10_000, seed=3)  # 10^10 pairs, never enumerated
    assert len(s.train) == 10_000 and len(np.intersect1d(s.train, s.test)) == 0


# ----------------------------------------------------------------------------- priors


def rows_of(s: torch.Tensor) -> dict[int, list[int]]:
    return {q: torch.nonzero(s[q]).flatten().tolist() for q in range(s.shape[0])}


def test_addition_alignment_by_hand():
    # width 2: a1 a0 + b1 b0 = r r r ; positions a1=0 a0=1 +=2 b1=3 b0=4 '='=5, 6, 7
    plain = rows_of(addition_alignment(2, reverse=False))
    assert plain[5] == [0, 3, 5]  # emits the hundreds (carry of place 1 only): a1, b1
    assert plain[6] == [0, 1, 3, 4, 6]  # tens: a1 b1 (own place), a0 b0 (carry)
    assert plain[7] == [1, 4, 7]  # units: a0, b0
    assert all(plain[q] == [q] for q in range(5))  # operand queries see only themselves
    rev = rows_of(addition_alignment(2, reverse=True))
    assert rev[5] == [1, 4, 5] and rev[6] == [0, 1, 3, 4, 6] and rev[7] == [0, 3, 7]


def test_multiplication_alignment_by_hand():
    # width 2, reversed: a1=0 a0=1 *=2 b1=3 b0=4 '='=5; place k is emitted at 5 + k
    full = rows_of(multiplication_alignment(2, reverse=True))
    assert full[5] == [1, 4, 5]  # k=0: a0 b0
    assert full[6] == [0, 1, 3, 4, 6]  # k=1: a0b0, a0b1, a1b0 (and carries)
    assert full[7] == [0, 1, 3, 4, 7] and full[8] == [0, 1, 3, 4, 8]
    own = rows_of(multiplication_alignment(2, reverse=True, window=0))
    assert own[5] == [1, 4, 5]
    assert own[6] == [0, 1, 3, 4, 6]
    assert own[7] == [0, 3, 7]  # only a1 b1 has i + j = 2
    assert own[8] == [8]  # i + j = 3 is impossible: the top digit is pure carry
    plain = rows_of(multiplication_alignment(2, reverse=False, window=0))
    assert plain[5] == [5] and plain[8] == [1, 4, 8]


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("width", [2, 3, 5])
def test_structures_are_causal_with_self(op, width):
    s = arith_structure(op, width, reverse=True)[0]
    T = arith_seq_len(width, op)
    assert s.shape == (T, T)
    assert torch.equal(s, s.tril())
    assert (s.diagonal() == 1).all()


def test_split_heads_one_key_per_head_for_addition():
    shared = addition_alignment(3)
    per = split_heads(shared, 4)
    assert per.shape == (4, 11, 11)
    assert torch.equal(per.amax(0), shared)  # union over heads is the shared pattern
    assert (per.diagonal(dim1=1, dim2=2) == 1).all()
    row = emitting_position(3, "add", 1, False)  # tens: a1 b1 a0 b0
    assert [int(per[h, row].sum()) for h in range(4)] == [2, 2, 2, 2]  # self + one operand digit
    assert torch.equal(arith_structure("add", 3, False, "per-head", 4), per)
    with pytest.raises(ValueError, match="variant"):
        arith_structure("add", 3, False, "rowwise", 4)


# ----------------------------------------------------------------------------- decoding


def test_greedy_decoding_is_self_consistent():
    """Each decoded digit is the argmax of a teacher-forced pass on the decoded sequence."""
    torch.manual_seed(0)
    seq = encode(np.arange(40) * 997, "add", 3)
    model = GPT(VOCAB, 11, dim=32, depth=2, heads=2).eval()
    pred = greedy_results(model, seq, 3, chunk=16)  # several chunks
    assert pred.shape == (40, 4)
    full = torch.cat([seq[:, : prompt_len(3)], pred], 1)
    logits, _ = model(full[:, :-1])
    assert torch.equal(logits[:, prompt_len(3) - 1 :].argmax(-1), pred)


def test_score_exact_and_digit_accuracy():
    seq = encode(np.array([idx(1, 2), idx(10, 20), idx(500, 500)]), "add", 3)
    pred = seq[:, prompt_len(3) :].clone()
    pred[1, 3] = (pred[1, 3] + 1) % 10  # one wrong digit
    pred[2] = (pred[2] + 1) % 10  # all wrong
    s = score(pred, seq, 3)
    assert s["exact_acc"] == pytest.approx(1 / 3)
    assert s["digit_acc"] == pytest.approx(7 / 12)
    assert s["digit_acc_by_position"] == pytest.approx([2 / 3, 2 / 3, 2 / 3, 1 / 3])


# ----------------------------------------------------------------------------- QK baselines


@pytest.mark.parametrize("method", ["qk-svd", "qk-opt"])
def test_qk_inits_match_the_pattern_at_step0(method):
    """QK inits put the digit-alignment pattern into attention: the result-emitting queries
    put far more mass on the allowed keys than a vanilla model does."""
    p = {"op": "add", "width": 2, "reverse": False, "prior": "shared", "heads": 2, "mul_window": None, "depth": 1}
    structures = arith.structures_for(p)
    rows = arith.emitting_rows(p)
    x, _ = inputs_targets(make_split("add", 2, 0.05, 300, seed=0).sequences("train"), 2)

    def mass(init: str) -> float:
        torch.manual_seed(0)
        model = GPT(VOCAB, x.shape[1], dim=32, depth=1, heads=2)
        QK_INITS[init].apply(model, x[:64], structures)
        _, attn = model(x[128:], return_attn=True)
        return allowed_mass(attn[0][:, :, rows], structures[0][:, rows], "all")

    vanilla, fitted = mass("vanilla"), mass(method)
    assert vanilla < 0.7
    assert fitted > 0.85 and fitted > vanilla + 0.2
    masked = GPT(VOCAB, x.shape[1], dim=32, depth=1, heads=2, priors=[MaskPrior(structures[0])])
    _, attn = masked(x[128:], return_attn=True)
    assert allowed_mass(attn[0][:, :, rows], structures[0][:, rows], "all") > 0.95


# ----------------------------------------------------------------------------- CLI


def test_fraction_option_per_op():
    assert arith.parse_fractions(["0.01", "0.02"], ["add", "mul"]) == {
        "add_fractions": [0.01, 0.02],
        "mul_fractions": [0.01, 0.02],
    }
    assert arith.parse_fractions(["add:0.004", "mul:0.03"], ["add", "mul"]) == {
        "add_fractions": [0.004],
        "mul_fractions": [0.03],
    }
    with pytest.raises(MasklabError, match="operation 'sub'"):
        arith.parse_fractions(["sub:0.1"], ["add"])
    with pytest.raises(MasklabError, match="numbers"):
        arith.parse_fractions(["add:x"], ["add"])


def test_fraction_items_pick_the_ops():
    ap = build_parser()
    cfg = flags.config_from_args(ap.parse_args(["arith", "--fraction", "mul:0.03"]), arith.Config())
    assert cfg.ops == ["mul"] and cfg.mul_fractions == [0.03]
    cfg = flags.config_from_args(ap.parse_args(["arith", "--fraction", "0.01"]), arith.Config())
    assert cfg.ops == ["add", "mul"] and cfg.add_fractions == cfg.mul_fractions == [0.01]


def test_cli_rejects_bad_input(capsys, tmp_path):
    assert main(["arith", "--op", "div", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "unknown operation 'div'" in capsys.readouterr().err
    assert main(["arith", "--fraction", "0.5", "--width", "2", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "lower --test-size" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_cli_end_to_end(tmp_path):
    out = tmp_path / "arith"
    argv = ["arith", "--quick", "--steps", "40", "--evals", "2", "--test-size", "400", "--method",
            "vanilla,qk-svd,mask", "--out", str(out), "--jobs", "1", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["study"] == "arith"
    assert [(r["task"], r["method"]) for r in res["runs"]] == [
        ("add-1%", "vanilla"),
        ("add-1%", "qk-svd"),
        ("add-1%", "mask"),
    ]
    for r in res["runs"]:
        assert r["extra"]["n_train"] == 10_000 and r["extra"]["n_test"] == 400
        for k in ("exact_acc", "digit_acc", "train_exact_acc", "prior_mass_step0"):
            assert 0.0 <= r["metrics"][k] <= 1.0
        assert r["curves"]["step"] == [0, 20, 40]
    by = {r["method"]: r["metrics"] for r in res["runs"]}
    assert by["mask"]["prior_mass_step0"] > by["vanilla"]["prior_mass_step0"]
    assert by["mask"]["mask_drift"] is not None and by["vanilla"]["mask_drift"] is None
    assert {p["task"] for p in res["paper"]} == {"add-0.4%", "mul-3%"}
    for fig in ("arith_acc_vs_fraction.png", "arith_test_acc.png", "arith_persistence.png"):
        assert (out / fig).stat().st_size > 0
    assert "exact_acc" in (out / "results.md").read_text()
    # resume: a second call reuses the finished runs
    assert main(argv) == 0
    assert json.loads((out / "results.json").read_text())["runs"] == res["runs"]
