"""Structures derived from interventions (issue 15): known graphs are recovered exactly,
unidentifiable pairs are reported, the shuffled control keeps density, the study runs."""

import json

import numpy as np
import pytest
import torch

from masklab.cli import main
from masklab.priors.bias import MaskPrior
from masklab.models import GPT, TokenEncoder
from masklab.priors.structures import DESIGNS, design_structure, support_block
from masklab.priors.structures_from_evidence import (
    agreement,
    derived_groups,
    from_interventions,
    function_effects,
    interactions,
    offset_profile,
    probe_effects,
    shuffled,
    to_structure,
    toeplitz_structure,
)
from masklab.lab.tasks.boolean import cube, make_task


def pairs_of(groups):
    return sorted({(min(a, b), max(a, b)) for g in groups for a in g for b in g if a != b})


@pytest.mark.parametrize(
    "n,fn,graph",
    [
        # x0 x1 + x2 x3 x4: edges inside each monomial; x5 has no effect
        (6, lambda x: x[:, 0] * x[:, 1] + x[:, 2] * x[:, 3] * x[:, 4], [(0, 1), (2, 3), (2, 4), (3, 4)]),
        # a chain x0x1 + x1x2 + x2x3 + a linear x4 (an effect, no interaction)
        (
            5,
            lambda x: x[:, 0] * x[:, 1] + x[:, 1] * x[:, 2] + x[:, 2] * x[:, 3] + 0.5 * x[:, 4],
            [(0, 1), (1, 2), (2, 3)],
        ),
        # a non-polynomial form: majority of x1, x2, x3 (all three pairs interact)
        (5, lambda x: np.sign(x[:, 1] + x[:, 2] + x[:, 3]), [(1, 2), (1, 3), (2, 3)]),
    ],
)
def test_function_with_a_known_graph_on_the_full_cube_is_recovered_exactly(n, fn, graph):
    x = cube(n).astype(np.float64)
    fx = function_effects(fn(x), np.ones(len(x), dtype=bool))
    inter = interactions(fx)
    assert inter.pairs == graph
    assert not inter.unidentifiable
    # the derived groups give exactly the hand-built support-block structure of those groups
    hand_groups = graph + [(v,) for v in range(n) if fx.first[v] > 0 and not any(v in e for e in graph)]
    assert torch.equal(support_block(derived_groups(inter), n), support_block(hand_groups, n))


def test_cyclic3_graph_is_recovered_from_its_seen_domain_only():
    task = make_task("cyclic3", 9)
    y = task.y.copy()
    y[task.unseen] = 1e6  # poison: a derivation that reads an unseen point would see this
    inter = interactions(function_effects(y, task.seen))
    assert inter.pairs == pairs_of(task.groups)
    assert inter.unidentifiable == []
    # the one-call path builds the hand-built design's structure from the derived graph
    derived, _, _ = from_interventions(y, task.seen, DESIGNS["layer-specific"], depth=2, heads=2)
    for layer in range(2):
        assert torch.equal(derived[layer], design_structure("layer-specific", task.groups, 9, layer, 2, 2))


@pytest.mark.parametrize("name", ["2parity", "maj3"])
def test_the_x0_x1_square_is_reported_unidentifiable(name):
    task = make_task(name, 6)
    fx = function_effects(task.y, task.seen)
    assert fx.unidentifiable() == [(0, 1)]
    assert np.isnan(fx.pair[0, 1]) and fx.squares[0, 1] == 0
    drop = interactions(fx, unidentifiable="drop")
    allow = interactions(fx, unidentifiable="allow")
    assert (0, 1) not in drop.pairs and drop.assumed == []
    assert allow.assumed == [(0, 1)]
    assert "four corners" in drop.unidentifiable[0][2]
    # maj3's other pairs are measured on the seen domain (x1 = 1 or x0 = 1 fixes a seen square)
    assert drop.pairs == ([(0, 2), (1, 2)] if name == "maj3" else [])
    assert drop.variables == ([0, 1, 2] if name == "maj3" else [0, 1])


def test_shuffled_control_keeps_density_and_differs():
    s = support_block([(0, 1, 2), (3, 4)], 8)
    for seed in range(3):
        sh = shuffled(s, seed)
        assert sh.sum() == s.sum()
        assert torch.equal(sh.diagonal(), s.diagonal())
        assert not torch.equal(sh, s)
    assert not torch.equal(shuffled(s, 0), shuffled(s, 1))


def test_to_structure_threshold_and_top_k():
    e = np.array([[0.0, 1.0, 0.05, 0.5], [0.2, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.3, 0.2, 0.02, 0.0]])
    s = to_structure(e, threshold=0.1)
    assert s.tolist() == [[1, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 0], [1, 1, 0, 1]]
    k = to_structure(e, top_k=1, self_loops=False)
    assert k.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]


def test_agreement_counts_allowed_entries():
    hand = torch.tensor([[1.0, 1, 0], [0, 1, 0], [0, 0, 1]])
    derived = torch.tensor([[1.0, 0, 1], [0, 1, 0], [0, 0, 1]])
    a = agreement(derived, hand)
    assert a["precision"] == pytest.approx(3 / 4) and a["recall"] == pytest.approx(3 / 4)
    assert a["jaccard"] == pytest.approx(3 / 5)


def test_probe_hiding_finds_the_only_key_a_query_can_use():
    """With a hard prior that lets CLS read only x1 (and itself), hiding x1 from CLS changes
    the output and hiding any other key does not."""
    from masklab.priors.bias import MaskPrior

    torch.manual_seed(0)
    s = torch.eye(5)
    s[0, 2] = 1
    model = TokenEncoder(2, 4, 16, 1, 2, [MaskPrior(s, mode="hard")])
    tokens = torch.randint(0, 2, (64, 4))
    pe = probe_effects(model, tokens)
    assert pe.effects[0, 2] > 1e-3 and pe.effects[0, 0] > 1e-3
    assert np.allclose(pe.effects[0, [1, 3, 4]], 0, atol=1e-6)  # hard mode: a large finite negative
    assert pe.forwards == 1 + 25


def test_evidence_prior_study_quick(tmp_path):
    out = tmp_path / "ep"
    rc = main(
        [
            "evidence-prior",
            "--task",
            "maj3",
            "--steps",
            "8",
            "--width",
            "16",
            "--depth",
            "1",
            "--heads",
            "2",
            "--batch",
            "16",
            "--evals",
            "2",
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--no-progress",
            "--unidentifiable",
            "drop",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert sorted(r["method"] for r in res["runs"]) == ["mask", "mask-derived", "mask-shuffled", "vanilla"]
    der = json.loads((out / "derivation.json").read_text())["maj3"]
    assert der["verdicts"]["unidentifiable"][0]["pair"] == [0, 1]
    assert der["agreement"][0]["recall"] < 1.0  # the dropped x0 <-> x1 entries
    assert der["cost"]["function_queries"] == 3 * 2**13
    assert (out / "structures_maj3.png").stat().st_size > 1000
    md = (out / "results.md").read_text()
    assert "not identifiable: (x0, x1)" in md and "| maj3 | mask-derived | 1 |" in md


# ---------------------------------------------------------------------------- probe on other models (arith, vision, lm)


def chain_gpt(T: int, depth: int) -> tuple[GPT, torch.Tensor]:
    """A GPT whose query i may read only keys i and i-1 (hard mask prior in every block): an
    arith-like carry chain, the model's direct interaction graph known by construction."""
    s = torch.eye(T) + torch.diag(torch.ones(T - 1), -1)
    torch.manual_seed(0)
    return GPT(7, T, 16, depth, 2, [MaskPrior(s, mode="hard") for _ in range(depth)]), s


@pytest.mark.parametrize("depth", [1, 2])
def test_probe_recovers_a_chain_graph_exactly(depth):
    model, s = chain_gpt(6, depth)
    tokens = torch.randint(0, 7, (32, 6))
    pe = probe_effects(model, tokens, head_rows=tuple(range(6)), distribution=True)
    # keys above the diagonal (the GPT's own causal mask) are not measured, nor row 0's only key
    assert np.isnan(pe.effects[np.triu_indices(6, 1)]).all() and np.isnan(pe.effects[0, 0])
    assert pe.forwards == 1 + sum(i + 1 for i in range(1, 6))
    # a small threshold keeps exactly the allowed keys: deeper blocks relay i-2 through i-1,
    # but hiding i-2 from query i in every block does not cut that path, so no entry appears
    assert torch.equal(to_structure(pe.effects, threshold=1e-4), s)
    # a wrong graph (a model that reads every earlier key) is not mistaken for the chain
    dense = GPT(7, 6, 16, depth, 2)
    assert not torch.equal(
        to_structure(
            probe_effects(dense, tokens, head_rows=tuple(range(6)), distribution=True).effects, threshold=1e-4
        ),
        s,
    )


def test_probe_rows_restrict_what_is_measured():
    model, s = chain_gpt(6, 1)
    pe = probe_effects(model, torch.randint(0, 7, (8, 6)), rows=[4, 5], head_rows=tuple(range(6)), distribution=True)
    assert np.isnan(pe.effects[:4]).all() and np.isfinite(pe.effects[5, :6]).all()
    assert pe.forwards == 1 + 5 + 6
    assert to_structure(pe.effects, threshold=1e-4)[:4].tolist() == torch.eye(6)[:4].tolist()  # unmeasured: itself only


def test_shuffled_within_a_causal_region_keeps_density_and_the_rest():
    T = 8
    s = torch.eye(T)
    s[5, [3, 4]] = s[6, [4, 5]] = s[7, [5, 6]] = 1
    region = torch.zeros(T, T, dtype=torch.bool)
    region[5:] = torch.ones(T, T).tril(-1).bool()[5:]
    for seed in range(4):
        sh = shuffled(s, seed, region)
        assert sh.sum() == s.sum() and sh[region].sum() == s[region].sum()
        assert torch.equal(sh[~region], s[~region])  # the diagonal and unmeasured rows are kept
        assert torch.equal(sh, sh.tril())  # nothing moved above the diagonal
    assert any(not torch.equal(shuffled(s, seed, region), s) for seed in range(4))


def test_offset_profile_and_toeplitz():
    T = 6
    i = np.arange(T)
    d = i[:, None] - i[None, :]
    effects = np.where(d >= 0, 1.0 / (1 + np.abs(d)), np.nan)
    effects[:3] = np.nan  # measured rows 3..5 only
    prof = offset_profile(effects)
    assert np.allclose(prof, 1.0 / (1 + np.arange(T)))
    s = toeplitz_structure(prof > 0.3)
    assert s.tolist() == [[1.0 if 0 <= a - b <= 2 else 0.0 for b in range(T)] for a in range(T)]


def test_evidence_prior_arith_derives_a_causal_structure_and_trains_with_it(tmp_path):
    from masklab.priors.structures import arith_structure

    out = tmp_path / "ep-arith"
    rc = main(
        [
            "evidence-prior",
            "--task",
            "arith",
            "--op",
            "add",
            "--fraction",
            "0.004",
            "--steps",
            "20",
            "--evals",
            "1",
            "--probe-points",
            "32",
            "--top-k",
            "2",
            "--method",
            "mask-derived,mask-shuffled",
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rec = json.loads((out / "derivation.json").read_text())["arith"]
    hand, derived = torch.tensor(rec["hand"][0]), torch.tensor(rec["derived"][0])
    assert torch.equal(hand, arith_structure("add", 3)) and derived.shape == (1, 11, 11)
    assert torch.equal(derived, derived.tril())  # causal
    assert rec["report"]["rows"] == [7, 8, 9, 10]  # the rows whose outputs the loss reads
    assert torch.equal(derived[0, :7], torch.eye(11)[:7])  # the other rows read only themselves
    assert rec["report"]["carry_links_possible"] == 6  # a0,b0 for place 2; a0,b0,a1,b1 for place 3
    assert (derived[0, 7:] > 0.5).sum(1).le(2 + 1).all()  # --top-k 2 per measured row, plus itself
    assert rec["cost"]["probe_steps"] == 2 and rec["cost"]["forward_passes"] == 1 + 8 + 9 + 10 + 11
    runs = {r["method"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    shuf = torch.tensor(runs["mask-shuffled"]["spec"]["params"]["structures"][0])
    assert shuf.sum() == derived.sum() and torch.equal(shuf, shuf.tril()) and torch.equal(shuf[0, :7], derived[0, :7])
    # each run's prior is its own structure (arith measures the step-0 mass on it): derived != shuffled
    assert runs["mask-shuffled"]["metrics"]["prior_mass_step0"] != runs["mask-derived"]["metrics"]["prior_mass_step0"]
    assert "exact_acc_first_eval" in runs["mask-derived"]["metrics"]
    assert "carry links beyond the place below" in (out / "results.md").read_text()


def test_evidence_prior_vision_and_lm_derive(tmp_path):
    out = tmp_path / "ep-vl"
    rc = main(
        [
            "evidence-prior",
            "--task",
            "vision,lm",
            "--steps",
            "10",
            "--derive-only",
            "--probe-points",
            "4",
            "--probe-rows",
            "2",
            "--top-k",
            "3",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rec = json.loads((out / "derivation.json").read_text())
    v, lm_rec = rec["vision"], rec["lm"]
    assert (
        torch.tensor(v["derived"][0]).shape == (1, 17, 17) and len(v["derived"]) == 4
    )  # cpu-digits: 16 patches, 4 blocks
    assert (torch.tensor(v["derived"][0][0]).sum(1) <= 3 + 1).all()  # top-3 per row, plus itself
    assert 0 <= v["report"]["fraction_within_radius_1"] <= 1
    assert lm_rec["report"]["rows"] == [31, 63] and len(lm_rec["report"]["kept_offsets"]) == 3
    d = torch.tensor(lm_rec["derived"][0][0])
    assert torch.equal(d, d.tril()) and d.diagonal().eq(1).all()


def test_probe_pairs_find_a_product_and_flag_the_unmeasurable_square(tmp_path):
    """Second order at CLS: with CLS allowed to read x0 and x1 only (hard prior), hiding x2 adds
    nothing to any pair (interaction exactly 0) while hiding x0 and x1 together is not the sum of
    the two (CLS is left with itself); the study flags maj3's (x0, x1) as unidentifiable."""
    from masklab.priors.structures_from_evidence import probe_pair_effects

    torch.manual_seed(0)
    s = torch.eye(4)
    s[0, [1, 2]] = 1
    s[1:, 1:] = 1
    model = TokenEncoder(2, 3, 16, 1, 2, [MaskPrior(s, mode="hard")])
    pp = probe_pair_effects(model, torch.randint(0, 2, (64, 3)), row=0, keys=[1, 2, 3])
    assert np.isnan(pp.pair[0]).all() and pp.pair[1, 2] == pp.pair[2, 1]
    assert abs(pp.pair[1, 2]) > 1e-3 and abs(pp.pair[1, 3]) < 1e-6 and abs(pp.pair[2, 3]) < 1e-6
    assert pp.single[3] < 1e-6 and pp.single[1] > 1e-3
    assert pp.forwards == 1 + 3 + 3
    out = tmp_path / "ep-probe"
    rc = main(
        [
            "evidence-prior",
            "--task",
            "maj3",
            "--source",
            "probe",
            "--steps",
            "20",
            "--width",
            "16",
            "--depth",
            "1",
            "--heads",
            "2",
            "--probe-points",
            "32",
            "--derive-only",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    so = json.loads((out / "derivation.json").read_text())["maj3"]["second_order"]
    assert [u["pair"] for u in so["unidentifiable"]] == [[0, 1]] and "four corners" in so["unidentifiable"][0]["reason"]
    assert len(so["interaction"]) == 15 and so["true_pairs"] == [[0, 1], [0, 2], [1, 2]]
    assert "not identifiable (probe value" in (out / "results.md").read_text()
