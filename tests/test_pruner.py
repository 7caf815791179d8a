"""The pruner: its label variants, its training (a wrong loss or target fails), keep auto,
and `masklab train-router --docs --questions` end to end on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import HAVE_HF, needs_dense
from masklab.util.errors import MasklabError
from masklab.lab.routers.registry import prune_one

ROW = {"window": [3, 7, 9, 12], "weights": [0.2, 2.5, -0.4, 1.1], "attention": [0.5, 0.1, 0.3, 0.05], "marked": [9, 40]}


def test_the_three_label_variants_differ_only_in_their_sets():
    from masklab.lab.train_pruner import target_set

    assert target_set(ROW, "causal", 1.0) == [1, 3]
    assert target_set(ROW, "causal", 2.0) == [1]
    assert target_set(ROW, "causal", 2.5) == []  # above, not at
    assert target_set(ROW, "attention", 1.0) == [0, 2]  # as many as the causal set, the most attended
    assert target_set(ROW, "marks", 1.0) == [2]  # marked units inside the window
    with pytest.raises(MasklabError, match="unknown labels"):
        target_set(ROW, "gold", 1.0)


@needs_dense
@pytest.mark.parametrize("design,epochs,lr", [("head", 6, 5e-3), ("lora", 12, 2e-3)])
def test_training_ranks_the_target_first_and_a_wrong_target_does_not(design, epochs, lr, tmp_path):
    from masklab.lab.train_pruner import Example, TrainConfig, save, train
    from masklab.context.pruner import load_pruner

    facts = [
        ("Which fruit is yellow?", ["Bananas are yellow.", "The sky is blue.", "Grass is green.", "Snow is white."]),
        ("What colour is the sky?", ["Bananas are yellow.", "The sky is blue.", "Grass is green.", "Snow is white."]),
    ]
    # a target the cosine does not prefer: the unit about snow, for every question
    assert not any(int(load_embedder_scores(q, u).argmax()) == 3 for q, u in facts)
    ex = [Example(q, u, [3]) for q, u in facts] * 4
    model, rec = train(ex, TrainConfig(design=design, epochs=epochs, lr=lr), progress=False)
    assert rec["loss"][-1] < rec["loss"][0] and rec["epochs"] == epochs
    assert all(int(model.rank(q, u).argmax()) == 3 for q, u in facts)
    save(
        model, tmp_path / "p.safetensors", {"labels": "causal"}
    )  # stored and loaded (adapters merged): the same ranking
    loaded, meta = load_pruner(tmp_path / "p.safetensors")
    assert meta["design"] == design
    for q, u in facts:
        torch.testing.assert_close(loaded.rank(q, u), model.rank(q, u), atol=1e-4, rtol=0)
    with pytest.raises(MasklabError, match="no training question has a target"):
        train([Example("q?", ["a.", "b."], [])], TrainConfig(), progress=False)


def load_embedder_scores(question: str, units: list[str]) -> torch.Tensor:
    from masklab.context.embedder import load_embedder

    emb = load_embedder()
    return emb.encode(units) @ emb.query(question)


def test_keep_auto_keeps_the_units_above_the_threshold():
    from masklab.context.router import Router
    from masklab.text.document import Document

    class Fixed(Router):
        name = "fixed"
        keep_auto = 0.5

        def score(self, doc, question):
            return torch.tensor([0.9, 0.1, 0.6, 0.2])

    doc = Document(units=["one two", "three four", "five six", "seven eight"])
    assert prune_one(Fixed(), doc, "q?", "auto").kept == [0, 2]
    Fixed.keep_auto = 5.0
    assert prune_one(Fixed(), doc, "q?", "auto").kept == [0]  # the top unit always
    with pytest.raises(MasklabError, match="keep auto needs a router"):
        prune_one(type("R", (Router,), {"score": lambda s, d, q: torch.zeros(4), "name": "r"})(), doc, "q?", "auto")


def test_the_relative_keep_rule_keeps_more_where_no_unit_stands_out():
    from masklab.context.router import Router
    from masklab.text.document import Document
    from masklab.text.selection import auto_fraction

    class Relative(Router):
        name, keep_auto, keep_rule, score_range = "relative", 0.5, "relative", (0.0, 1.0)
        scores = torch.tensor([0.9, 0.1, 0.6, 0.2])

        def score(self, doc, question):
            return self.scores

    doc = Document(units=["one two", "three four", "five six", "seven eight"])
    assert prune_one(Relative(), doc, "q?", "auto").kept == [0, 2]  # at least 0.45
    Relative.scores = torch.tensor([0.09, 0.01, 0.12, 0.2])  # no unit stands out: the cut falls with the best score
    assert prune_one(Relative(), doc, "q?", "auto").kept == [2, 3]  # at least 0.1, where a plain 0.5 keeps one unit
    assert prune_one(Relative(), doc, "q?", 0.25, threshold=0.5).kept == []  # --threshold stays a plain score
    assert prune_one(Relative(), doc, "q?", 0.25, threshold=0.1).kept == [2, 3]
    with pytest.raises(MasklabError, match="unknown keep rule 'median'"):
        auto_fraction(torch.ones(2), [1, 1], 0.5, "median")


def _pairs(tmp_path, n):
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    colours = ["red", "blue", "green", "white", "black", "grey", "pink", "gold", "brown", "teal", "cyan"]
    lines = []
    for d in range(2):
        sent = [f"Box {d}{i} is {c}." for i, c in enumerate(colours)]
        (docs / f"d{d}.txt").write_text(" ".join(sent))
        for i, c in enumerate(colours):
            lines.append(
                {"doc": f"d{d}.txt", "question": f"What colour has box {d}{i}?", "answers": [c], "evidence": [sent[i]]}
            )
    qf = tmp_path / "q.jsonl"
    qf.write_text("".join(json.dumps(r) + "\n" for r in lines[:n]))
    return docs, qf


def test_too_few_pairs_are_refused_before_the_model_loads(tmp_path, capsys):
    from masklab.cli import main

    docs, qf = _pairs(tmp_path, 19)
    assert (
        main(
            [
                "train-router",
                "--docs",
                str(docs),
                "--questions",
                str(qf),
                "--model",
                "no-such",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "19 usable question / answer pairs" in err[0] and "at least 20" in err[0]
    qf.write_text('{"doc": "d0.txt", "question": "Q?"}\n')
    assert main(["train-router", "--docs", str(docs), "--questions", str(qf), "--out", str(tmp_path / "o")]) == 2
    assert '"answers" must be a non-empty list' in capsys.readouterr().err


@needs_dense
@pytest.mark.skipif(not HAVE_HF, reason="pretrained extra not installed")
def test_train_router_on_your_documents_end_to_end(tmp_path, capsys):
    from conftest import save_tiny_folder
    from masklab.cli import main

    model = save_tiny_folder(tmp_path / "tiny", "llama", max_positions=4096)
    docs, qf = _pairs(tmp_path, 22)
    out = tmp_path / "out"
    args = [
        "train-router",
        "--docs",
        str(docs),
        "--questions",
        str(qf),
        "--model",
        str(model),
        "--out",
        str(out),
        "--no-progress",
        "--causal-threshold",
        "-1",
    ]  # a random model moves no likelihood: every unit counts
    assert main(args) == 0
    cap = capsys.readouterr()
    assert "labelling cost estimate: 22 pairs" in cap.err and "pruner-causal.safetensors" in cap.out
    rows = [json.loads(x) for x in (out / "labels.jsonl").read_text().splitlines()]
    assert len(rows) == 22 and all(len(r["weights"]) == len(r["window"]) for r in rows)
    labelled = (out / "labels.jsonl").read_bytes()
    assert main(args) == 0  # resumed: nothing labelled again
    assert (out / "labels.jsonl").read_bytes() == labelled  # the same rows, none appended or rewritten
    capsys.readouterr()
    ctx = tmp_path / "ctx.txt"
    ctx.write_text((docs / "d1.txt").read_text())
    assert (
        main(
            [
                "compress",
                "--context",
                str(ctx),
                "--question",
                "Which colour has box 13?",
                "--model",
                str(model),
                "--router",
                "pruner",
                "--router-file",
                str(out / "pruner-causal.safetensors"),
                "--keep",
                "0.2",
                "--json",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    assert got["router"] == "pruner" and got["kept"]
    # the scores are the trained file's, not the shipped pruner's
    from masklab.context.pruner import load_pruner
    from masklab.context.routers import load_router

    question = "Which colour has box 13?"
    mine = load_pruner(out / "pruner-causal.safetensors")[0].rank(question, got["units"])
    assert torch.allclose(torch.tensor(got["scores"]), mine.float(), atol=1e-4)
    from masklab.text.document import Document

    shipped = load_router("pruner").score(Document(units=got["units"]), question)
    assert not torch.allclose(torch.tensor(got["scores"]), shipped.float(), atol=1e-4)
    # the context pruner's kind, on the same labels (read again, not relabelled), through the same command
    assert main(args + ["--kind", "pruner-ctx"]) == 0
    assert (out / "labels.jsonl").read_bytes() == labelled and "ctx-causal.safetensors" in capsys.readouterr().out
    assert (
        main(
            [
                "compress",
                "--context",
                str(ctx),
                "--question",
                question,
                "--model",
                str(model),
                "--router",
                "pruner-ctx",
                "--router-file",
                str(out / "ctx-causal.safetensors"),
                "--keep",
                "auto",
                "--json",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    mine = load_router("pruner-ctx", path=out / "ctx-causal.safetensors").score(Document(units=got["units"]), question)
    assert got["kept"] and got["scores"] == pytest.approx(mine.tolist(), abs=1e-5)
    assert mine.tolist() != pytest.approx(
        load_router("pruner-ctx").score(Document(units=got["units"]), question).tolist(), abs=1e-4
    )  # its own head, not the shipped one
    # the default router's kind (the passage pruner), on the same labels
    assert main(args + ["--kind", "pruner-passage"]) == 0
    assert (out / "labels.jsonl").read_bytes() == labelled and "passage-causal.safetensors" in capsys.readouterr().out
    doc = Document(units=got["units"])
    mine = load_router("pruner-passage", path=out / "passage-causal.safetensors").score(doc, question)
    assert mine.tolist() != pytest.approx(load_router("pruner-passage").score(doc, question).tolist(), abs=1e-4)


@pytest.mark.parametrize(
    "argv,match",
    [
        (
            ["--kind", "evidence", "--docs", "d", "--questions", "q.jsonl"],
            "--kind evidence trains on the generated families",
        ),
        (["--kind", "pruner-ctx", "--docs", "d"], "--docs and --questions go together"),
        (["--kind", "pruner", "--model", "no-such-model"], "no corpus labels for no-such-model"),
        (
            ["--kind", "cross"],
            "the cross pruner left the product for the lab (below pruner-ctx on val); train it "
            "with python scripts/train_cross.py",
        ),
    ],
)
def test_train_router_kinds_refuse_what_they_cannot_train(tmp_path, capsys, argv, match):
    from masklab.cli import main

    assert main(["train-router", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


@needs_dense
def test_the_shipped_pruners_load_with_their_labels_and_keep_auto():
    from masklab.lab.routers import load_any
    from masklab.text.document import Document

    chosen = load_any("pruner").meta
    for name, labels in (("pruner", "causal"), ("pruner-attention", "attention"), ("pruner-marks", "marks")):
        r = load_any(name)
        assert r.meta["labels"] == labels and r.keep_auto is not None
        # the variants differ only in their labels
        assert (r.meta["design"], r.meta["threshold"], r.meta["epochs"]) == (
            chosen["design"],
            chosen["threshold"],
            chosen["epochs"],
        )
        assert r.path.name == f"{labels}.safetensors"  # each reads its own shipped file
    doc = Document(units=["Bananas are yellow.", "The sky is blue.", "Snow is white."])
    causal, attention = (load_any(n).score(doc, "Which fruit is yellow?") for n in ("pruner", "pruner-attention"))
    assert not torch.allclose(causal, attention) and int(causal.argmax()) == 0  # the shipped pruner finds the answer
