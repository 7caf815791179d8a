"""Evidence searches on hand-built oracles whose evidence is known exactly."""

import math

import pytest
import torch

from masklab.lab.evidence import SEARCHES


def needs(required: set[int], any_of: list[set[int]] = ()):
    """Oracle: the answer holds iff every item in ``required`` is visible and, for each set in
    ``any_of``, at least one of its items is visible (redundant evidence)."""
    calls = {"n": 0}

    def holds(keep: torch.Tensor) -> torch.Tensor:
        calls["n"] += keep.shape[0]
        ok = keep[:, sorted(required)].all(dim=1) if required else torch.ones(keep.shape[0], dtype=torch.bool)
        for alt in any_of:
            ok &= keep[:, sorted(alt)].any(dim=1)
        return ok

    return holds, calls


@pytest.mark.parametrize("n,required", [(16, {3}), (16, {0, 15}), (64, {5, 6, 40}), (7, set()), (1, {0})])
def test_loo_and_group_testing_find_the_necessary_items(n, required):
    for name in ("loo", "group-testing"):
        holds, calls = needs(required)
        ev = SEARCHES[name].find(holds, n)
        assert ev.items == sorted(required), name
        assert ev.forward_passes == calls["n"]


@pytest.mark.parametrize("n,required", [(16, {3}), (64, {9}), (256, {100, 200}), (256, {7, 8, 9})])
def test_group_testing_uses_about_k_log_n_passes(n, required):
    holds, calls = needs(required)
    ev = SEARCHES["group-testing"].find(holds, n)
    k = len(required)
    assert ev.forward_passes <= k * math.ceil(math.log2(n)) + k + 1
    assert ev.forward_passes < SEARCHES["loo"].find(needs(required)[0], n).forward_passes


def test_greedy_minimal_is_sufficient_and_one_minimal_with_redundancy():
    # item 2 is necessary; {5, 9} are interchangeable: loo sees only item 2
    holds, _ = needs({2}, [{5, 9}])
    assert SEARCHES["loo"].find(holds, 12).items == [2]
    ev = SEARCHES["greedy-minimal"].find(holds, 12)
    assert ev.items == [2, 9]  # index order drops 5 first, then 9 is needed
    keep = torch.zeros(1, 12, dtype=torch.bool)
    keep[0, ev.items] = True
    assert holds(keep)[0]  # sufficient on its own
    for i in ev.items:  # and no single item can be dropped
        k = keep.clone()
        k[0, i] = False
        assert not holds(k)[0]
    assert SEARCHES["greedy-minimal"].find(holds, 12, order=[9] + list(range(9)) + [10, 11]).items == [2, 5]


def test_group_testing_with_redundancy_differs_from_loo_and_says_so():
    # hiding {5, 9} together breaks the answer though neither alone does
    holds, _ = needs(set(), [{5, 9}])
    assert SEARCHES["loo"].find(holds, 16).items == []
    assert SEARCHES["group-testing"].find(holds, 16).items != []


@pytest.mark.parametrize("name", ["loo", "greedy-minimal", "group-testing"])
def test_batched_over_examples_equals_one_at_a_time(name):
    cases = [
        (needs({2}, [{5, 9}])[0], 12, None),
        (needs({0, 3})[0], 5, [4, 3, 2, 1, 0]),
        (needs(set())[0], 3, None),
        (needs({40})[0], 64, None),
    ]
    calls = []

    def holds_many(keeps):
        calls.append(sum(k.shape[0] for k in keeps))
        return [case[0](k) if k.shape[0] else torch.zeros(0, dtype=torch.bool) for case, k in zip(cases, keeps)]

    many = SEARCHES[name].find_many(holds_many, [c[1] for c in cases], [c[2] for c in cases])
    one = [SEARCHES[name].find(h, n, o) for h, n, o in cases]
    assert [(e.items, e.forward_passes) for e in many] == [(e.items, e.forward_passes) for e in one]
    assert sum(calls) == sum(e.forward_passes for e in one)  # every variant asked once
    assert len(calls) == max(e.forward_passes if name != "loo" else 1 for e in one)  # one call per step
    if name == "greedy-minimal":
        assert [e.items for e in many] == [[2, 9], [0, 3], [], [40]]


def test_a_new_search_is_one_generator_method():
    from masklab.lab.evidence.search import EvidenceSearch, hide_rows, register

    @register("last-item")
    class LastItem(EvidenceSearch):
        def steps(self, n_items, order):
            ok = yield hide_rows([[n_items - 1]], n_items)
            return [] if ok[0] else [n_items - 1]

    try:
        assert SEARCHES["last-item"].find(needs({4})[0], 5).items == [4]
        many = SEARCHES["last-item"].find_many(lambda keeps: [needs({2})[0](k) for k in keeps], [3, 5])
        assert [(e.items, e.forward_passes) for e in many] == [([2], 1), ([], 1)]
    finally:
        del SEARCHES["last-item"]
