"""Routing with one model and answering with another (``--router-model``), and
``masklab train-router`` for a user's model folder: the refusal when it answers too few
training examples, the warning of a router fitted on few, and a ``--router-file`` hint
that names a file that exists.

A tiny random Llama folder (tests/conftest.py: character tokens) stands for the
user's model; the packaged SmolLM2 router ranks for it."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from conftest import needs_smol, save_tiny_folder as save_folder  # noqa: E402
from masklab.cli import main  # noqa: E402
from masklab.context import Document, Request, load_router  # noqa: E402
from masklab.util.errors import MasklabError  # noqa: E402
from masklab.pretrained.models import load  # noqa: E402

torch.set_num_threads(1)
TEXT = (
    "The red key is in the hall. Anna moved to Oslo in May. The blue key is in room nine. "
    "Bob stayed in Rome. The brass key was lost."
)
QUESTION = "Where does Anna live now?"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_folder(tmp_path_factory.mktemp("mine") / "my.model-v1", "llama")


@needs_smol
def test_a_folder_without_a_router_is_ranked_by_smollm2_and_counts_its_own_tokens(
    folder, smol, shared_loads, tmp_path, capsys
):
    ctx = tmp_path / "ctx.txt"
    ctx.write_text(TEXT)
    rc = main(
        [
            "compress",
            "--model",
            str(folder),
            "--context",
            str(ctx),
            "--question",
            QUESTION,
            "--router",
            "evidence",
            "--keep",
            "0.4",
            "--json",
        ]
    )
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["kept"]
    (note,) = [n for n in res["notes"] if "ranked" in n]
    assert "smollm2-135m's evidence router ranked the units" in note and "ships no evidence router" in note
    mine = load(str(folder))
    doc = Document(units=res["units"])
    assert res["unit_tokens"] == doc.lengths(mine.tokenizer) != doc.lengths(smol.tokenizer)  # the folder's tokens
    assert res["unit_tokens"] == [len(u) + (i > 0) for i, u in enumerate(res["units"])]  # one character, one token
    # the scores are SmolLM2's own router's, read through SmolLM2's first layers
    assert res["scores"] == pytest.approx(load_router("evidence", smol).score(doc, QUESTION).tolist(), abs=1e-6)
    r = load_router("evidence", mine, router_model="smollm2-135m")  # the Python API, explicitly
    assert r.reader.name == "smollm2-135m" and r.tokenizer is mine.tokenizer and "ships no" not in r.notes[0]
    pruned = r.prune(Request(QUESTION, TEXT, fraction=0.4))
    assert pruned.notes == r.notes and pruned.lengths == res["unit_tokens"]


@needs_smol
def test_router_model_errors_are_one_line(folder, smol, shared_loads, tmp_path, capsys):
    ctx = tmp_path / "ctx.txt"
    ctx.write_text(TEXT)
    rc = main(
        [
            "compress",
            "--context",
            str(ctx),
            "--question",
            QUESTION,
            "--router",
            "bm25",
            "--router-model",
            "smollm2-135m",
        ]
    )
    assert rc != 0 and "--router-model is for the trained routers" in capsys.readouterr().err
    with pytest.raises(MasklabError) as e:  # a folder ships no router: the hint names the file train-router writes
        load_router("evidence", smol, router_model=str(folder))
    assert "DIR/my_model-v1.safetensors" in str(e.value) and "//" not in str(e.value)


def fake_labels(lm, ex, query, accept, **kw):
    """Labels without a search: the gold units, as if the model answered rightly."""
    return {"answer": "x", "correct": True, "passes": 3, "seconds": 0.01, "evidence": ex.gold, "attention": ex.gold}


def test_train_router_on_a_folder_refuses_too_few_right_answers_and_prices_the_labels(folder, tmp_path, capsys):
    rc = main(
        [
            "train-router",
            "--model",
            str(folder),
            "--out",
            str(tmp_path / "r"),
            "--examples",
            "1",
            "--length",
            "1024",
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    err = capsys.readouterr().err
    assert rc != 0 and "a router needs at least 20" in err and "--router-model smollm2-135m" in err
    assert "labelling cost estimate: 4 examples x" in err  # printed after the first example
    assert not list((tmp_path / "r").glob("*.safetensors"))


def test_train_router_on_a_folder_prints_a_router_file_that_exists_and_warns(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("masklab.lab.linear_routers.make_labels", fake_labels)
    out = tmp_path / "r"
    rc = main(
        [
            "train-router",
            "--model",
            str(folder),
            "--out",
            str(out),
            "--quick",
            "--length",
            "1024",
            "--no-progress",
            "--layers",
            "1",
            "--device",
            "cpu",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0 and "fitted on only 8 labelled examples" in captured.err
    (hint,) = [line for line in captured.out.splitlines() if "--router-file" in line]
    path = hint.split("--router-file ")[1].split()[0]
    assert (out / "my_model-v1.safetensors").samefile(path) and (out / "my_model-v1.json").is_file()
    assert json.loads((out / "my_model-v1.json").read_text())["warning"].startswith("fitted on only 8")
    assert not (folder.parent / "my.model-v1.safetensors").exists()  # nothing written beside the user's folder
    ctx = tmp_path / "ctx.txt"
    ctx.write_text(TEXT)
    rc = main(
        [
            "compress",
            "--model",
            str(folder),
            "--context",
            str(ctx),
            "--question",
            QUESTION,
            "--router",
            "evidence",
            "--router-file",
            path,
            "--json",
        ]
    )
    res = json.loads(capsys.readouterr().out)
    assert rc == 0 and [n for n in res["notes"] if "only 8 labelled examples" in n]
    assert not [n for n in res["notes"] if "ranked" in n]  # its own router: no other model ranked
