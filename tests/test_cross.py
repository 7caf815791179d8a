"""The context-aware pruner (masklab.lab.cross) and the keep-set labels (masklab.lab.labels):
windows tile any document with context on both sides, a unit's score reads its neighbours, training
learns a target that only the context reveals, storing and loading keeps the scores, a killed
training resumes, and the keep-set targets credit both units of a pair and the current statement.
The lab's cross router: no file, one error; a window it never read gets pruner-ctx's calibrated
probability, no made-up one; its second hop reads the question and the whole best unit."""

from __future__ import annotations

import pytest
import torch

from conftest import needs_dense, needs_peft
from masklab.text.document import Document
from masklab.util.errors import MasklabError
from masklab.lab.routers.registry import prune_one


@pytest.fixture(scope="module")
def cross():
    from conftest import HAVE_DENSE

    if not HAVE_DENSE:
        pytest.skip("needs sentence-transformers and MiniLM (scripts/install-pretrained.sh)")
    from masklab.lab.cross import CrossPruner

    torch.manual_seed(0)
    return CrossPruner(max_tokens=256, carry=16)


def test_windows_tile_every_unit_once_in_order_with_context_on_both_sides(cross):
    units = [f"Sentence number {i} says that item {i} weighs {i * 3} grams." for i in range(120)]
    units[5] = "word " * 400  # a unit longer than a unit may be: read by its first tokens
    wins = cross.windows("Which item weighs 30 grams?", units)
    assert len(wins) > 5  # no ceiling on the document: more windows
    assert [w.start for w in wins] == [0] + [w.stop for w in wins[:-1]] and wins[-1].stop == len(units)
    for w in wins:
        assert w.ids.numel() <= cross.max_tokens and w.ids.shape == w.unit_of.shape
        core = w.unit_of[w.unit_of >= 0]
        assert sorted(set(core.tolist())) == list(range(w.start, w.stop))
    middle = wins[2]
    first_core = int((middle.unit_of >= 0).nonzero()[0])
    q_end = int((middle.ids == cross.tokenizer.sep_token_id).nonzero()[0])
    assert first_core - q_end - 1 == cross.carry  # the carried text before the core
    assert int((middle.unit_of >= 0).nonzero()[-1]) == middle.ids.numel() - 2 - cross.carry  # and after it


def test_a_units_score_reads_its_neighbours_where_the_unit_alone_pruner_does_not(cross):
    units = ["The release notes list several changes.", "It was removed in version 2.", "Other tools stay."]
    other = ["The release notes list several changes.", "It was removed in version 2.", "Bananas are yellow."]
    with torch.no_grad():
        a = cross.logits("What was removed?", units)
        b = cross.logits("What was removed?", other)
    assert a.shape == (3,)
    assert abs(float(a[1] - b[1])) > 1e-4  # unit 1 is the same text; only its neighbour changed


@needs_dense
@needs_peft
@pytest.mark.parametrize("full, lr, head_lr", [(False, 2e-3, 2e-2), (True, 1e-4, 1e-2)])
def test_training_learns_a_target_only_the_context_reveals_and_survives_save_load(tmp_path, full, lr, head_lr):
    from masklab.lab.cross import CrossConfig, Example, load_cross, save, train

    # the target is the sentence after "The next sentence is the answer.": the same sentence text
    # elsewhere is not a target, so a pruner reading each unit alone cannot rank it first
    filler = ["Grass is green.", "Snow is white.", "The sky is blue.", "Coal is black."]
    examples = []
    for k in range(4):
        units = filler[:k] + ["The next sentence is the answer.", filler[k]] + filler[k + 1 :]
        examples.append(Example("Which sentence is the answer?", units, [k + 1]))
    model, rec = train(
        examples * 3, CrossConfig(epochs=6, full=full, lr=lr, head_lr=head_lr, batch=4, negatives=0.0), progress=False
    )
    assert rec["loss"][-1] < rec["loss"][0]
    for e in examples:
        assert int(model.rank(e.question, e.units).argmax()) == e.target[0]
    save(model, tmp_path / "c.safetensors", {"labels": "test"})
    loaded, meta = load_cross(tmp_path / "c.safetensors")  # adapters merged into the encoder, or float16 weights
    assert meta["design"] == ("cross-full" if full else "cross") and meta["labels"] == "test"
    for e in examples:
        torch.testing.assert_close(
            loaded.rank(e.question, e.units), model.rank(e.question, e.units), atol=2e-2 if full else 1e-4, rtol=0
        )
    with pytest.raises(MasklabError, match="no cross pruner"):
        load_cross(tmp_path / "missing.safetensors")


@needs_dense
@needs_peft
def test_a_killed_training_resumes_after_its_last_epoch(tmp_path):
    from masklab.lab.cross import CrossConfig, Example, train

    ex = [Example("Which is white?", ["Grass is green.", "Snow is white.", "The sky is blue."], [1])] * 2
    cfg = CrossConfig(epochs=1, batch=2, negatives=0.0, full=False, lr=3e-4)
    _, first = train(ex, cfg, checkpoint=tmp_path / "ck", progress=False)
    _, both = train(ex, CrossConfig(epochs=2, batch=2, negatives=0.0), checkpoint=tmp_path / "ck2", progress=False)
    _, resumed = train(ex, cfg, checkpoint=tmp_path / "ck", progress=False)  # nothing left to do
    assert resumed["loss"] == first["loss"] and len(both["loss"]) == 2
    assert both["loss"][0] == pytest.approx(first["loss"][0], abs=1e-6)  # the same first epoch
    with pytest.raises(MasklabError, match="other settings"):
        train(ex, CrossConfig(epochs=1, batch=1, negatives=0.0), checkpoint=tmp_path / "ck", progress=False)


@needs_dense
def test_a_training_stopped_mid_epoch_resumes_to_the_same_weights(tmp_path):
    from masklab.lab.cross import CrossConfig, Example, train

    units = ["Grass is green.", "Snow is white.", "The sky is blue.", "Coal is black."]
    ex = [Example(f"Which is {c}?", units, [i]) for i, c in enumerate(["green", "white", "blue", "black"])]
    cfg = CrossConfig(epochs=2, batch=1, negatives=0.0, checkpoint_steps=100)
    whole, rec = train(ex, cfg, progress=False)
    _, part = train(ex, cfg, checkpoint=tmp_path / "ck", progress=False, limit_seconds=0)  # stops after one step
    assert not part["done"] and part["epoch"] == 0 and part["batch"] == 1
    resumed, rest = train(ex, cfg, checkpoint=tmp_path / "ck", progress=False)
    assert rest["done"] and rest["steps"] == rec["steps"] == 8
    assert rest["loss"] == pytest.approx(rec["loss"], abs=1e-6)
    for a, b in zip(whole.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b)


def test_keepset_targets_credit_both_units_of_a_pair_the_restatement_and_not_the_superseded():
    from masklab.lab.labels import keepset_target

    # unit 0 alone and unit 2 alone barely help; together they do (two sentences that answer together)
    pair = {"logp_empty": -20.0, "logp_single": [-18.0, -19.5, -17.5, -19.0], "pairs": [[0, 2, -6.0], [0, 3, -17.0]]}
    assert keepset_target(pair, gain=1.0) == [0, 2]
    # unit 1 states the answer and unit 3 restates it: both; unit 0 is the superseded statement
    latest = {"logp_empty": -20.0, "logp_single": [-15.0, -3.0, -19.0, -3.4], "pairs": [[0, 1, -3.2], [1, 3, -2.9]]}
    assert keepset_target(latest, gain=1.0) == [1, 3]
    nothing = {"logp_empty": -5.0, "logp_single": [-5.2, -4.8], "pairs": [[0, 1, -4.9]]}
    assert keepset_target(nothing, gain=1.0) == []


def test_keepset_labels_read_each_unit_alone_batched_as_one_by_one(tiny_folders):
    from masklab.lab.labels import PAIR_TOP, answer_ids, keepset_label, read_alone
    from masklab.pretrained.models import load
    from masklab.text.query import Query

    lm = load(str(tiny_folders["llama"]))
    units = ["abc def.", "ghi jk lmnop.", "q.", "rst uvw xyz ab.", "cd ef gh.", "ij kl."]
    q, ans = Query("what?").text, answer_ids(lm, "ab cd")
    variants = [[]] + [[u] for u in units] + [[units[0], units[3]]]
    torch.testing.assert_close(
        read_alone(lm, variants, q, ans, batch=16), read_alone(lm, variants, q, ans, batch=1), atol=1e-4, rtol=0
    )  # left padding changes nothing
    row = keepset_label(lm, units, "what?", "ab cd")
    assert len(row["logp_single"]) == len(units) and len(row["pairs"]) == PAIR_TOP * (PAIR_TOP - 1) // 2
    assert row["passes"] == 2 + len(units) + len(row["pairs"])
    single = torch.tensor(row["logp_single"])
    top = set(torch.argsort(single, descending=True)[:PAIR_TOP].tolist())
    assert {i for i, j, _ in row["pairs"]} | {j for i, j, _ in row["pairs"]} == top  # pairs of the best singles


@pytest.fixture
def decider():
    """A throw-away router that decides how much to keep: a unit's score is its digit / 10,
    counting the calls of read (one per document, however many questions)."""
    from masklab.context.router import Router
    from masklab.context.routers import ROUTERS  # the registry filled: every product router's file imported
    from masklab.context.api import _router

    calls = []

    @ROUTERS.register("test-decider")
    class Decider(Router):
        score_range = (0.0, 1.0)
        keep_auto = 0.5

        def score(self, doc, question):
            return torch.tensor([int("".join(c for c in u if c.isdigit()) or 0) / 10 for u in doc.units])

        def read(self, doc, questions):
            calls.append(len(questions))
            return super().read(doc, questions)

    yield calls
    del ROUTERS["test-decider"]
    _router.cache_clear()


TEXT = "Unit 1 is here. Unit 7 is here. Unit 3 is here. Unit 9 is here. Unit 5 is here."


def test_prune_keeps_the_units_at_or_above_the_threshold_and_batches_one_document(decider):
    from masklab.context import prune

    out = prune("Which unit?", TEXT, threshold=0.5, router="test-decider")
    assert out["kept"] == [1, 3, 4] and out["pruned_context"] == "Unit 7 is here. Unit 9 is here. Unit 5 is here."
    assert out["scores"] == pytest.approx([0.1, 0.7, 0.3, 0.9, 0.5])
    assert out["compression_rate"] == pytest.approx(1 - out["kept_fraction"]) and 0 < out["compression_rate"] < 1
    none = prune("Which unit?", TEXT, threshold=0.95, router="test-decider")  # no unit reaches it: none kept
    assert (
        none["kept"] == []
        and none["pruned_context"] == ""
        and "no unit scores at least the threshold 0.95 (the best 0.9)" in " ".join(none["notes"])
    )
    assert prune("Which unit?", "Unit 2 alone.", threshold=0.95, router="test-decider")["kept"] == []  # one unit
    assert prune("Which unit?", TEXT, threshold=0.9, router="test-decider")["kept"] == [3]  # at it counts
    assert prune("Which unit?", TEXT, router="test-decider")["kept"] == [1, 3, 4]  # keep auto: the router's own 0.5
    decider.clear()
    many = prune(
        ["Which unit?", "Another?", "A third?"], [TEXT, TEXT, "Unit 2 alone."], threshold=0.5, router="test-decider"
    )
    assert sorted(decider) == [1, 2]  # the two questions on one text were scored in one call
    assert [m["kept"] for m in many] == [[1, 3, 4], [1, 3, 4], []]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"threshold": 1.5}, r"must be a number in \[0, 1\]"),
        ({"threshold": "high"}, r"must be a number in \[0, 1\]"),
        ({"question": "   "}, "question is empty"),
        ({"context": ""}, "context is empty"),
        ({"context": "text\x00\x01binary"}, "looks binary"),
        ({"context": ["a", "b"]}, "one question and one context"),
        ({"question": ["a?", "b?"], "context": ["x."]}, "2 questions and 1 contexts"),
    ],
)
def test_prune_refuses_bad_input_with_one_message(decider, kwargs, message):
    from masklab.context import prune

    args = {"question": "Which unit?", "context": TEXT, "router": "test-decider", **kwargs}
    with pytest.raises(MasklabError, match=message):
        prune(**args)


PASSAGES = ["Unit 1 is here. Unit 7 is here.", "Unit 3 is here. Unit 2 is here.", "Unit 9 is here."]


def passages_pruned(**budget):
    """:data:`PASSAGES` pruned within one budget by the decider."""
    from masklab.context import Request, load_router

    return load_router("test-decider").prune(Request.of("Which unit?", PASSAGES, router="test-decider", **budget))


def test_a_threshold_keeps_the_units_at_or_above_it_across_passages(decider):
    from masklab.integrations import Adapter

    out = passages_pruned(threshold=0.5)
    assert out.passage_kept == [[1], [], [0]] and out.texts == ["Unit 7 is here.", "", "Unit 9 is here."]
    assert out.to_json()["threshold"] == 0.5
    assert passages_pruned(threshold=0.95).passage_kept == [[], [], []]  # no unit reaches it
    assert passages_pruned(threshold=0.95).text == ""
    assert passages_pruned(keep="auto").passage_kept == [[1], [], [0]]  # its own 0.5
    assert passages_pruned(keep=0.25).passage_kept == [[], [], [0]]  # a fraction
    kept = Adapter("test-decider", threshold=0.25).kept(PASSAGES, "Which unit?")
    assert [(i, text) for i, text, _ in kept] == [
        (0, "Unit 7 is here."),
        (1, "Unit 3 is here."),
        (2, "Unit 9 is here."),
    ]
    with pytest.raises(MasklabError, match="each set the budget"):
        passages_pruned(threshold=0.5, target_tokens=10)


def test_a_router_with_context_keeps_the_best_units_neighbours_within_its_own_passage(decider, monkeypatch):
    from masklab.context import prune
    from masklab.context.routers import ROUTERS  # the registry filled: every product router's file imported

    assert prune("Which unit?", TEXT, keep=0.4, router="test-decider")["kept"] == [1, 3]
    monkeypatch.setattr(ROUTERS["test-decider"], "neighbours", 1)
    assert prune("Which unit?", TEXT, keep=0.4, router="test-decider")["kept"] == [3, 4]  # Unit 9 and the next
    assert prune("Which unit?", TEXT, keep="auto", router="test-decider")["kept"] == [1, 2, 3, 4]  # both beside it
    assert prune("Which unit?", TEXT, threshold=0.8, router="test-decider")["kept"] == [3]  # none below a threshold
    out = passages_pruned(keep=0.4)
    assert out.passage_kept == [[1], [], [0]]  # Unit 9's passage has no other unit: no neighbour is taken from another


def test_the_framework_adapters_take_a_threshold(decider):
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document

    from masklab.integrations.langchain import MasklabCompressor

    docs = [Document(page_content=t, metadata={"n": i}) for i, t in enumerate(PASSAGES)]
    out = MasklabCompressor(router="test-decider", threshold=0.5).compress_documents(docs, "Which unit?")
    assert [(d.metadata["n"], d.page_content) for d in out] == [(0, "Unit 7 is here."), (2, "Unit 9 is here.")]


def test_a_threshold_needs_a_router_that_decides():
    from masklab.context import prune

    with pytest.raises(MasklabError, match="decides how much"):
        prune("Which unit?", TEXT, threshold=0.5, router="bm25")


def _doc(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    units = torch.nn.functional.normalize(torch.randn(n, 16, generator=g), dim=-1)
    return units, torch.nn.functional.normalize(torch.randn(16, generator=g), dim=-1)


def test_the_context_head_starts_as_the_round5_ranking_and_handles_a_one_unit_document():
    from masklab.context.contextual import FEATURES, ContextHead, neighbourhood, probabilities

    units, q = _doc(9, 0)
    s, x = neighbourhood(units, q)
    assert x.shape == (9, len(FEATURES)) and torch.isfinite(x).all()
    head = ContextHead()
    assert torch.equal(torch.argsort(probabilities(head, units, q)), torch.argsort(units @ q))  # zero residual
    one = probabilities(head, units[:1], q)
    assert one.shape == (1,) and torch.isfinite(one).all()


def test_the_context_head_learns_the_unit_after_the_most_relevant_one():
    from masklab.context.contextual import load_head, probabilities
    from masklab.lab.train_ctx import Example, HeadConfig, save, train

    # the target is the unit right after the best-scoring one: invisible to a score of each unit alone
    examples = []
    for seed in range(40):
        units, q = _doc(12, seed)
        best = int((units @ q)[:-1].argmax())
        examples.append(Example(units, q, [best + 1]))
    head, rec = train(examples[:30], HeadConfig(epochs=80, lr=1e-2))
    assert rec["loss"][-1] < rec["loss"][0]
    hits = [int(probabilities(head, e.units, e.q).argmax()) == e.target[0] for e in examples[30:]]
    alone = [int((e.units @ e.q).argmax()) == e.target[0] for e in examples[30:]]
    assert sum(hits) >= 7 and sum(alone) <= 2  # held-out documents: the head reads the neighbourhood
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        save(head, Path(d) / "h.safetensors", {"labels": "test", "keep_auto": 0.5})
        loaded, meta = load_head(Path(d) / "h.safetensors")
    assert meta["keep_auto"] == 0.5
    e = examples[31]
    torch.testing.assert_close(probabilities(loaded, e.units, e.q), probabilities(head, e.units, e.q))


@needs_dense
def test_the_int8_context_pruner_ranks_as_the_float_one_does():
    from scipy.stats import spearmanr

    from masklab.context.routers import load_router
    from masklab.text.document import segment

    doc = segment(
        " ".join(
            f"Release {i} changed the {w} option to default to {i * 7}."
            for i, w in enumerate(["colour", "width", "depth", "cache", "retry", "timeout", "proxy", "quiet"])
        )
    )
    q = "What does the timeout option default to now?"
    f, i8 = load_router("pruner-ctx"), load_router("pruner-ctx", int8=True)
    assert i8.pruner is not f.pruner  # its own encoder: the float router is not quantised
    a, b = f.score(doc, q), i8.score(doc, q)
    assert int(a.argmax()) == int(b.argmax()) and spearmanr(a.numpy(), b.numpy())[0] > 0.8
    assert not torch.equal(a, b)  # a different path really ran


def test_a_second_hop_raises_the_unit_that_explains_what_the_best_unit_names():
    from masklab.context.routers.lexical import Lexical
    from masklab.text.document import Document

    # the question shares words only with the first unit; the second explains what the first names
    doc = Document(
        units=[
            "Colours are configurable.",
            "Per-user settings live in ~/.toolrc today.",
            "Nothing else here.",
            "The ~/.toolrc file is INI.",
        ]
    )
    question = "Which syntax do per-user settings use?"
    one, two = Lexical(), Lexical()
    two.hops = 2
    s1, s2 = one.read_hops(doc, [question]).values[0], two.read_hops(doc, [question]).values[0]
    assert int(s1.argmax()) == int(s2.argmax()) == 1
    assert s1[3] == s1[0] == s1[2]  # one hop cannot tell the explaining unit from filler
    assert s2[3] > s2[0] and s2[3] > s2[2] and torch.all(s2 >= s1)  # the second hop raises it; nothing falls
    assert prune_one(one, doc, question, keep=0.75).kept == [0, 1, 2]
    assert prune_one(two, doc, question, keep=0.75).kept == [1, 3]


@pytest.fixture(scope="module")
def cross_file(tmp_path_factory):
    """A cross pruner file of the packaged encoder and a random head (no training), read with two hops."""
    from conftest import HAVE_DENSE

    if not HAVE_DENSE:
        pytest.skip("needs sentence-transformers and MiniLM (scripts/install-pretrained.sh)")
    from masklab.lab.cross import CrossPruner, frozen, save

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("cross") / "c.safetensors"
    save(frozen(CrossPruner()), path, {"labels": "random", "keep_auto": 0.5, "hops": 2, "platt": [2.0, -1.0]})
    return path


ITEMS = [f"Item {i} weighs {10 * i} grams and has a label printed on its lid." for i in range(120)]


def test_the_cross_router_is_the_labs_and_refuses_to_run_without_a_file(cross_file):
    from masklab.context.routers import ROUTERS
    from masklab.lab.routers import LAB_ROUTERS, load_any

    assert "cross" in LAB_ROUTERS and "cross" not in ROUTERS  # it left the product: no packaged weights
    with pytest.raises(MasklabError, match=r"none is packaged: give its path \(path=\).*train_cross\.py"):
        load_any("cross")
    with pytest.raises(MasklabError, match="no cross pruner"):
        load_any("cross", path=cross_file.parent / "missing.safetensors")
    router = load_any("cross", path=cross_file)
    assert router.keep_auto == 0.5 and router.score_range == (0.0, 1.0) and router.hops == 2
    small = Document(units=["Grass is green.", "Snow is white.", "The sky is blue."])
    logits = router.model.logits("Which is white?", small.units)
    torch.testing.assert_close(router.read(small, ["Which is white?"]).values[0], torch.sigmoid(2 * logits - 1))


def test_the_cascade_reads_the_windows_the_pruner_picks_and_invents_no_score_for_the_others(cross_file):
    from masklab.context.routers import load_router
    from masklab.lab.routers import load_any

    router, doc, q = load_any("cross", path=cross_file), Document(units=ITEMS), "Which item weighs 300 grams?"
    full = router.read(doc, [q]).values[0]
    assert len(router.model.windows(q, ITEMS)) > 2
    router.max_windows = 2
    cascade = router.read(doc, [q]).values[0]
    read = [i for i in range(len(ITEMS)) if torch.isclose(cascade[i], full[i], atol=1e-5)]
    assert 0 < len(read) < len(ITEMS)  # two windows read as in full
    cos = load_router("pruner").score(doc, q)
    wins = sorted(router.model.windows(q, ITEMS), key=lambda w: -float(cos[w.start : w.stop].max()))[:2]
    assert read == [i for w in sorted(wins, key=lambda w: w.start) for i in range(w.start, w.stop)]
    unread = [i for i in range(len(ITEMS)) if i not in read]
    ctx = load_router("pruner-ctx").read(doc, [q]).values[0]  # the calibrated probability a model really gave
    torch.testing.assert_close(cascade[unread], ctx[unread])


def test_the_second_hop_reads_the_question_and_the_whole_best_unit(cross_file, monkeypatch):
    from masklab.lab.cross import QUESTION_TOKENS
    from masklab.lab.routers import load_any

    router = load_any("cross", path=cross_file)
    units = [f"Setting {i} " + " ".join(f"word{i}x{k}" for k in range(40)) + "." for i in range(6)]
    doc, q = Document(units=units), "Which setting holds the value that the other setting names?"
    read = []
    real = router.model.window_logits
    monkeypatch.setattr(router.model, "window_logits", lambda wins, batch=16: read.append(wins) or real(wins, batch))
    first = router.read(doc, [q]).values[0]
    best, tok = int(first.argmax()), router.model.tokenizer
    unit = router.model.unit_ids(units)[best]
    assert len(unit) > QUESTION_TOKENS  # cut to the question's 64 tokens, most of it would be lost
    read.clear()
    both = router.read_hops(doc, [q]).values[0]
    assert len(read) == 2
    head = [tok.cls_token_id, *tok(q, add_special_tokens=False)["input_ids"], *unit, tok.sep_token_id]
    for w in read[1]:  # the second hop: the question, then every token of the best unit, then the window
        assert w.ids[: len(head)].tolist() == head
        assert w.ids.numel() <= router.model.encoder.config.max_position_embeddings
    assert sorted(i for w in read[1] for i in range(w.start, w.stop)) == list(range(len(units)))
    again = router.read(doc, [q], then=[best]).values[0]
    torch.testing.assert_close(both, torch.maximum(first, again))


@needs_dense
@needs_peft
def test_the_cross_router_reads_a_trained_file(tmp_path):
    from masklab.lab.cross import CrossConfig, Example, save, train
    from masklab.lab.routers import load_any

    ex = [Example("Which is white?", ["Grass is green.", "Snow is white.", "The sky is blue."], [1])]
    model, _ = train(ex, CrossConfig(epochs=1, batch=1, negatives=0.0), progress=False)
    save(model, tmp_path / "c.safetensors", {"labels": "test", "keep_auto": 0.5})
    small = Document(units=["Grass is green.", "Snow is white.", "The sky is blue."])
    got = load_any("cross", path=tmp_path / "c.safetensors").read(small, ["Which is white?"]).values[0]
    torch.testing.assert_close(got, model.rank("Which is white?", small.units), atol=1e-3, rtol=0)  # float16 file
