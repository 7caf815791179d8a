"""The passage level: each unit's paragraph, section and heading path (``segment``, ``stack``), the features
that read a unit in its passage and a second hop (``masklab.context.passage``), and the ``pruner-passage``
router through the one request path."""

from __future__ import annotations

import pytest
import torch

from masklab.context.passage import FEATURES, passage_features
from masklab.context.router import Request, stack
from masklab.text.document import Document, segment

GUIDE = """# Install

Run the installer once. It asks for a folder.

## Upgrades

It keeps your settings. Old plugins are removed.

# Use

Start it from the menu.
"""

MAN = """NAME
       frob - frobnicate files

OPTIONS
       -q, --quiet
              print nothing

       -v     print every file
"""


def test_segment_gives_each_unit_its_paragraph_section_and_heading_path():
    doc = segment(GUIDE)
    titles = [doc.title_of(i) for i in range(len(doc.units))]
    it = next(i for i, u in enumerate(doc.units) if "It keeps" in u)
    assert titles[it] == "Install > Upgrades"  # the heading path, not only the nearest heading
    assert titles[-1] == "Use"  # a heading of the same level closes the one before
    assert doc.sections[it] != doc.sections[0] and doc.sections[it] == doc.sections[it + 1]
    assert doc.paragraphs[it] == doc.paragraphs[it + 1] != doc.paragraphs[0]


def test_a_man_page_section_name_over_its_indented_text_heads_a_section():
    doc = segment(MAN)
    quiet = next(i for i, u in enumerate(doc.units) if "quiet" in u)
    assert doc.title_of(quiet) == "OPTIONS" and doc.title_of(0) == "NAME"


def test_stacked_passages_keep_their_groups_apart():
    a, b = segment("First passage. It has two sentences."), segment("Second passage. Also two.")
    doc = stack([a, b])
    assert doc.passage_of == [0, 0, 1, 1]
    # one paragraph each: a group never spans two passages, though both passages' paragraphs are numbered 0
    assert doc.groups("paragraph") == [0, 0, 1, 1] and doc.groups("section") == [0, 0, 1, 1]
    assert Document(units=["x", "y"]).groups("paragraph") == [0, 1]  # unknown paragraphs: each unit alone


def _embeddings(n: int, d: int = 8) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.eye(n, d) + 0.01, dim=1)


def test_the_hop_lifts_the_unit_that_explains_what_the_best_unit_names():
    units = [
        "The release was signed by Quorra.",
        "Nothing here.",
        "Weather notes.",
        "Quorra maintains the build farm.",
        "More filler.",
    ]
    doc = Document(units=units, paragraphs=[0, 1, 2, 3, 4])
    e = _embeddings(len(units))
    q = e[0]  # the question is about unit 0
    s, x = passage_features(doc, e, q, e[3], "Who signed the release?")  # the hop's embedding points at unit 3
    assert x.shape == (len(units), len(FEATURES))
    col = {f: x[:, i] for i, f in enumerate(FEATURES)}
    assert int(col["z_hop"].argmax()) == 3  # the hop reads what the best unit names
    assert int(col["unit_bm25_hop"][1:].argmax()) + 1 == 3  # "Quorra" matches exactly in the hop's BM25
    assert float(col["unit_bm25"][3]) <= float(col["unit_bm25"][0])  # without the hop, no word of it matches
    no_hop = passage_features(doc, e, q, q, "Who signed the release?")[1]
    assert float(no_hop[3, FEATURES.index("z_hop")]) < float(col["z_hop"][3])


def test_a_unit_reads_its_sections_heading_through_the_group_features():
    text = "# Frobnication\n\nIt was added in 2019.\n\nIt runs daily.\n\n# Weather\n\nIt rained a lot.\n"
    doc = segment(text)
    e = _embeddings(len(doc.units))
    s, x = passage_features(doc, e, e[0], e[0], "When was frobnication added?")
    bm = x[:, FEATURES.index("section_bm25")]
    runs = next(i for i, u in enumerate(doc.units) if "It runs" in u)
    rained = next(i for i, u in enumerate(doc.units) if "rained" in u)
    assert float(bm[runs]) > float(bm[rained])  # "It runs daily" sits under the heading that names the question's word


@pytest.fixture(scope="module")
def passage_router():
    from masklab.context.routers import load_router

    return load_router("pruner-passage")


def test_pruner_passage_prunes_several_passages_through_one_request(passage_router):
    passages = [
        "The Quorra release shipped in May. Its signing key was rotated.",
        "Lunch is served at noon. The canteen closes at three.",
        "Quorra's signing key is kept by the security team in a hardware token.",
    ]
    out = passage_router.prune(Request("Who keeps the key that signed the release?", passages, fraction=0.5))
    assert all(0.0 <= s <= 1.0 for s in out.scores)
    assert out.rank[-1] == 1  # the lunch passage ranks last
    assert out.kept and all(out.doc.passage_of[i] != 1 for i in out.kept)


def test_a_head_trained_on_other_features_is_refused(tmp_path):
    from masklab.context.contextual import ContextHead
    from masklab.lab.train_ctx import save
    from masklab.context.routers import load_router
    from masklab.util.errors import MasklabError

    save(ContextHead(), tmp_path / "head.safetensors", {})  # pruner-ctx's features, not the passage level's
    with pytest.raises(MasklabError, match="trained on other features"):
        load_router("pruner-passage", path=tmp_path / "head.safetensors")


def test_the_pieces_of_one_long_sentence_rank_and_are_kept_together():
    from masklab.context.passage import together

    text = "Short one. " + "This sentence is extremely long and goes on " * 9 + "until it ends. Next."
    doc = segment(text, None, 30)
    pieces = [i for i, g in enumerate(doc.sentences_of) if doc.sentences_of.count(g) > 1]
    assert len(pieces) == 3 and len(set(doc.sentences_of)) == len(doc.units) - len(pieces) + 1
    scores = torch.zeros(len(doc.units))
    scores[pieces[1]] = 0.9  # one piece scores high: every piece of its sentence does
    out = together(doc, scores)
    assert all(float(out[i]) == pytest.approx(0.9) for i in pieces) and float(out[0]) == 0.0


def test_the_json_and_the_page_show_each_units_heading_path():
    from masklab.context.html import page
    from masklab.context.routers import load_router

    out = load_router("bm25").prune(Request("Are settings kept on upgrade?", [GUIDE], fraction=0.5))
    got = out.to_json()
    it = next(i for i, u in enumerate(got["units"]) if "It keeps" in u)
    assert got["unit_sections"][it] == "Install > Upgrades" and got["unit_sections"][-1] == "Use"
    assert "in Install &gt; Upgrades" in page(out, "Are settings kept on upgrade?")


def test_text_without_full_stops_is_no_sentence_kept_together():
    table = "\n".join(f"row {i} | item-{i} | owner {'Dana' if i == 37 else 'Sam'}" for i in range(80))
    doc = segment(table, None, 20)
    assert len(doc.units) > 10 and len(set(doc.sentences_of)) == len(doc.units)  # each chunk ranks on its own
