"""Prior structure builders, checked by hand on small layouts (CLS at 0, x_i at i + 1)."""

import pytest
import torch

from masklab.util.errors import MasklabError
from masklab.priors.structures import DESIGNS, cyclic_groups, design_structure, pairs_per_head, pairwise, support_block


def test_cyclic_groups_wrap_around():
    assert cyclic_groups(5, 3) == [(0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 0), (4, 0, 1)]


def test_support_block_by_hand():
    s = support_block([(0, 1)], 3)  # tokens: CLS, x0, x1, x2
    want = torch.tensor(
        [
            [1, 1, 1, 0],
            [1, 1, 1, 0],
            [1, 1, 1, 0],
            [0, 0, 0, 1],
        ],
        dtype=torch.float32,
    )
    assert torch.equal(s, want)


def test_pairwise_has_no_self_attention_in_the_support():
    s = pairwise([(0, 1, 2)], 4)
    want = torch.tensor(
        [
            [1, 1, 1, 1, 0],
            [0, 0, 1, 1, 0],
            [0, 1, 0, 1, 0],
            [0, 1, 1, 0, 0],
            [0, 0, 0, 0, 1],
        ],
        dtype=torch.float32,
    )
    assert torch.equal(s, want)


def test_per_head_gives_each_head_one_partner():
    s = pairs_per_head([(0, 1)], 2, heads=2)
    assert s.shape == (2, 3, 3)
    assert s[0, 1, 2] == 1 and s[0, 2, 1] == 0  # head 0: x0 reads x1
    assert s[1, 2, 1] == 1 and s[1, 1, 2] == 0  # head 1: x1 reads x0
    assert (s[:, 0, 1:] == 1).all()  # CLS reads the support in every head


def test_layer_specific_interacts_first_then_reads_out():
    first = design_structure("layer-specific", [(0, 1)], 3, 0, 2, 4)[0]
    last = design_structure("layer-specific", [(0, 1)], 3, 1, 2, 4)[0]
    assert first[0].tolist() == [1, 0, 0, 0] and first[1, 2] == 1
    assert last[0].tolist() == [1, 1, 1, 0] and last[1, 2] == 0


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_every_design_leaves_each_query_a_key(name):
    s = design_structure(name, cyclic_groups(6, 3), 6, 0, 2, 4)
    assert s.dim() == 3 and (s.sum(-1) > 0).all()


def test_bad_input():
    with pytest.raises(MasklabError, match="unknown prior design 'nope'; choose from support-block, pairwise"):
        design_structure("nope", [(0, 1)], 3, 0, 1, 1)
    with pytest.raises(ValueError, match="outside"):
        support_block([(0, 5)], 3)
