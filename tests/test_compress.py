"""``masklab compress`` and ``masklab.context`` on documents and questions written here by
hand (no generator): the kept text holds the answering sentence, bad input is one clear
line, the page highlights the kept units in a real browser, and the answer from the pruned
text is right on both packaged models (slow)."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from masklab.context.router import DEFAULT_ROUTER

from conftest import HAVE_GEMMA, needs_smol
from masklab.cli import main
from masklab.context import Document, Request, load_router, segment, select

REPORT = """Minutes of the Riverside Library board meeting, held on the third of March.

The meeting opened at seven in the evening with eight members present. \
The chair welcomed two new volunteers who will run the children's reading hour. \
A long discussion followed about the leaking roof above the periodicals room; \
a contractor will be asked for a second quote.

The treasurer, Margaret Okafor, presented the accounts for the winter quarter. \
Donations were slightly lower than last year, while the book sale raised more than expected. \
After some debate, the annual budget was approved by Daniel Reyes, the board president, on behalf of the members.

Other business: the summer opening hours will stay as they are. The café corner will get new chairs. \
The next meeting is planned for early May, in the small hall.
"""
ANSWERING = (
    "After some debate, the annual budget was approved by Daniel Reyes, the board president, on behalf of the members."
)

TRAVEL = """Our trip started in Lisbon, where it rained for two days. \
We took the night train north and arrived in Porto before dawn.
In Porto we stayed with an old friend who works as a baker. \
She told us that the best view of the river is from the monastery on the hill.
The following week we rented bicycles and rode along the coast. \
My sister lost her passport in a small fishing village called Vila Nova \
and spent a whole afternoon at the police station.
On the last evening we ate grilled sardines by the harbour and watched the boats come in.
"""

# the commands below load SmolLM2 (its tokenizer counts the tokens): once per session (tests/conftest.py)
shares_smol = pytest.mark.usefixtures("shared_loads")


@pytest.mark.parametrize("router", ["lexical", "bm25"])
@pytest.mark.parametrize(
    "text,question,answering",
    [
        (REPORT, "Who approved the budget?", ANSWERING),
        (
            TRAVEL,
            "Where did my sister lose her passport?",
            "My sister lost her passport in a small fishing village called Vila Nova",
        ),
        (TRAVEL, "Who works as a baker?", "In Porto we stayed with an old friend who works as a baker."),
    ],
)
def test_word_routers_keep_the_answering_sentence(router, text, question, answering):
    pruned = load_router(router).prune(Request(question, text, fraction=0.2))
    assert answering in pruned.text
    assert pruned.kept_fraction <= 0.2 + 1e-9 or len(pruned.kept) == 1
    assert pruned.scores[pruned.doc.units.index(next(u for u in pruned.doc.units if answering in u))] == max(
        pruned.scores
    )


def test_select_keeps_the_best_units_neighbours_right_after_it():
    s, lengths = torch.tensor([0.1, 0.2, 0.9, 0.05, 0.3, 0.8]), [10] * 6
    assert select(s, lengths, 0.34) == [2, 5]
    assert select(s, lengths, 0.34, context=1) == [2, 3]  # the next unit before the previous, then the next best
    assert select(s, lengths, 0.5, context=1) == [1, 2, 3]
    assert select(s, lengths, 0.34, context=1, within=3) == [1, 2]  # unit 3 is another passage's
    below = torch.tensor([-0.5, 0.9, -0.2, 0.4])
    assert select(below, [10] * 4, 1.0, fill=False) == [1, 3]  # stops at the first unit below 0
    assert select(below, [10] * 4, 1.0, fill=False, context=1) == [0, 1, 2, 3]  # the best unit's neighbours stay


def test_segment_keeps_spans_and_chunks_text_without_punctuation():
    doc = segment(REPORT)
    assert ANSWERING in doc.units and all(doc.source[a:b] == u for u, (a, b) in zip(doc.units, doc.spans))
    assert doc.text_of([0, len(doc.units) - 1]).count("\n\n") == 1  # a removed paragraph leaves one paragraph break
    code = "\n".join(f"value_{i} = compute(x_{i}, y_{i}, z_{i})" for i in range(40))
    chunks = segment(code, unit_tokens=30)
    assert len(chunks.units) > 5 and all(len(u.split()) <= 30 for u in chunks.units)
    assert "".join(u.replace("\n", "") for u in chunks.units) == code.replace("\n", "").replace("    ", "")


def test_select_is_the_one_rule_and_unknown_router_is_named():
    from masklab.util.errors import MasklabError

    doc = Document(units=["apple banana", "cherry damson elder", "fig"])
    assert select(load_router("lexical").score(doc, "cherry damson elder?"), doc.lengths(None), 0.5) == [1]
    with pytest.raises(MasklabError, match="unknown router 'nope'; choose from"):
        load_router("nope")
    with pytest.raises(MasklabError, match="reads a language model"):
        load_router("evidence")


def run(capsys, *argv):
    code = main(["compress", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "content,match",
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b"   \n\t ", "is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "looks binary"),
        ("Caf\xe9 au lait. Le budget fut approuv\xe9.".encode("latin-1"), "not valid UTF-8"),
        (b"x" * 1_100_000, "over the limit"),
    ],
)
def test_bad_context_files_are_one_line_before_any_model_loads(tmp_path, capsys, content, match):
    path = tmp_path / "ctx.txt"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, "--context", str(path), "--question", "Who?", "--model", "no-such-model-is-needed")
    assert code == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err + out


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--question", ""], "question is empty"),
        (["--question", "   "], "question is empty"),
        (["--question", "Who?", "--keep", "0"], "--keep must be in (0, 1]"),
        (["--question", "Who?", "--keep", "1.5"], "--keep must be in (0, 1]"),
        (["--question", "Who?", "--router", "nope"], "unknown router 'nope'"),
        (["--question", "Who?", "--router", "snapkv"], "add --answer"),
        (["--question", "Who?", "--model", "nope"], "unknown model 'nope'"),
        (["--question", "Who?", "--unit-tokens", "0"], "--unit-tokens must be >= 1"),
        (["--question", "Who?", "--html", "/no/such/folder/page.html"], "its folder does not exist"),
        (
            ["--question", "Who?", "--router", "snapkv", "--answer", "--html", "page.html"],
            "keeps no text; --html highlights kept units: drop --html",
        ),
    ],
)
def test_bad_options_are_one_line(tmp_path, capsys, argv, match):
    path = tmp_path / "ctx.txt"
    path.write_text(REPORT)
    code, out, err = run(capsys, "--context", str(path), *argv)
    assert code == 2 and match in err and "Traceback" not in err + out


@needs_smol
@shares_smol
def test_latin1_with_encoding_and_stdin(tmp_path, capsys, monkeypatch):
    import io

    path = tmp_path / "ctx.txt"
    path.write_bytes(REPORT.encode("latin-1"))
    code, out, _ = run(
        capsys, "--context", str(path), "--encoding", "latin-1", "--question", "Who approved the budget?"
    )
    assert code == 0 and "Daniel Reyes" in out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(TRAVEL.encode())))
    code, out, _ = run(capsys, "--context", "-", "--question", "Who works as a baker?", "--keep", "0.2")
    assert code == 0 and "baker" in out


@needs_smol
@shares_smol
def test_json_has_every_field(tmp_path, capsys):
    path = tmp_path / "ctx.txt"
    path.write_text(REPORT)
    code, out, _ = run(capsys, "--context", str(path), "--question", "Who approved the budget?", "--json")
    res = json.loads(out)
    assert code == 0
    for key in ("units", "kept", "scores", "pruned_text", "kept_fraction", "router", "router_seconds", "unit_tokens"):
        assert key in res
    from masklab.context.router import DEFAULT_ROUTER

    units, kept, scores, lengths = res["units"], res["kept"], res["scores"], res["unit_tokens"]
    assert res["router"] == DEFAULT_ROUTER and res["router_seconds"] > 0
    assert ANSWERING in res["pruned_text"] and units.index(ANSWERING) in kept
    assert len(scores) == len(units) == len(lengths) and kept == sorted(set(kept)) and kept
    # the fields agree with one another: the pruned text is the kept units in reading order, the
    # fraction is theirs, and the best scored unit is among them
    at = [res["pruned_text"].index(units[i]) for i in kept]
    assert at == sorted(at) and not any(
        units[i] in res["pruned_text"]
        for i in range(len(units))
        if i not in kept and all(units[i] not in units[k] for k in kept)
    )
    assert res["kept_fraction"] == pytest.approx(sum(lengths[i] for i in kept) / sum(lengths))
    assert 0 < res["kept_fraction"] <= 0.25 and max(range(len(units)), key=scores.__getitem__) in kept


@needs_smol
@shares_smol
def test_int8_scores_with_the_quantised_encoder(tmp_path, capsys):
    from masklab.context.routers import load_router
    from masklab.text.document import segment

    path = tmp_path / "ctx.txt"
    path.write_text(REPORT)
    code, out, _ = run(
        capsys,
        "--context",
        str(path),
        "--question",
        "Who approved the budget?",
        "--router",
        "pruner-ctx",
        "--int8",
        "--threshold",
        "0.2",
        "--json",
    )
    res = json.loads(out)
    doc = segment(REPORT, load_router("pruner-ctx", "smollm2-135m").tokenizer)
    assert code == 0 and res["units"] == doc.units
    int8 = load_router("pruner-ctx", int8=True).score(doc, "Who approved the budget?").tolist()
    float_ = load_router("pruner-ctx").score(doc, "Who approved the budget?").tolist()
    assert res["scores"] == pytest.approx(int8) and res["scores"] != pytest.approx(float_, abs=1e-6)
    top, context = max(range(len(doc.units)), key=res["scores"].__getitem__), load_router("pruner-ctx").neighbours
    assert all(res["scores"][i] >= 0.2 or abs(i - top) <= context for i in res["kept"])


@needs_smol
@shares_smol
def test_text_without_sentence_punctuation_is_chunked_not_refused(tmp_path, capsys):
    path = tmp_path / "table.txt"
    path.write_text(
        "\n".join(f"row {i} | item-{i} | owner {'Dana' if i == 37 else 'Sam'} | shelf {i % 7}" for i in range(80))
    )
    code, out, _ = run(
        capsys, "--context", str(path), "--question", "Which row has owner Dana?", "--json", "--unit-tokens", "40"
    )
    res = json.loads(out)
    assert code == 0 and len(res["units"]) > 10 and "owner Dana" in res["pruned_text"]


@needs_smol
@shares_smol
def test_long_document_is_capped_to_the_model_window(tmp_path, capsys):
    filler = " ".join(f"Paragraph {i} talks about the weather in a town far away." for i in range(1200))
    path = tmp_path / "long.txt"
    path.write_text(filler + " " + ANSWERING)
    code, out, _ = run(
        capsys, "--context", str(path), "--question", "Who approved the budget?", "--keep", "1", "--json"
    )
    res = json.loads(out)
    assert code == 0 and res["context_tokens"] > res["model_window"]
    assert any("capped" in n for n in res["notes"]) and ANSWERING in res["pruned_text"]
    assert sum(t for i, t in enumerate(res["unit_tokens"]) if i in res["kept"]) < res["model_window"]


@needs_smol
@shares_smol
@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="no chromium (Debian package 'chromium'; .ci/run installs it)"
)
def test_html_page_highlights_the_kept_units_in_a_browser(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    from masklab.context.html import page

    path = tmp_path / "ctx.txt"
    path.write_text(REPORT)
    code, _, _ = run(
        capsys, "--context", str(path), "--question", "Who approved the budget?", "--html", str(tmp_path / "p.html")
    )
    assert code == 0

    def highlighted(html_path):
        png = tmp_path / (html_path.stem + ".png")
        subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1000,700",
                f"--screenshot={png}",
                html_path.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        a = np.asarray(Image.open(png).convert("RGB")).astype(int)
        return int(
            ((a[..., 0] > 240) & (a[..., 1] > 200) & (a[..., 1] < 235) & (a[..., 2] < 130)).sum()
        )  # the kept units' yellow

    assert highlighted(tmp_path / "p.html") > 2000
    pruned = load_router("bm25").prune(Request("Who approved the budget?", REPORT, fraction=0.2))
    pruned.kept = []  # the same page with nothing kept has no highlight
    (tmp_path / "none.html").write_text(page(pruned, "Who approved the budget?"))
    assert highlighted(tmp_path / "none.html") < 1000  # only the legend's "kept" sample


@pytest.mark.slow
@needs_smol
@shares_smol
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_answer_from_the_pruned_text_is_right(tmp_path, capsys, model):
    if model == "gemma3-270m" and not HAVE_GEMMA:
        pytest.skip("Gemma 3 270M not installed")
    path = tmp_path / "ctx.txt"
    path.write_text(TRAVEL)
    code, out, _ = run(
        capsys,
        "--model",
        model,
        "--context",
        str(path),
        "--question",
        "In which village did my sister lose her passport?",
        "--keep",
        "0.25",
        "--answer",
        "--json",
    )
    res = json.loads(out)
    assert code == 0 and "Vila Nova" in res["answer"], res["answer"]


@needs_smol
@shares_smol
@pytest.mark.parametrize("budget", [["--keep", "auto"], ["--threshold", "0.3"]])
def test_several_passages_where_the_pruner_decides_how_much(tmp_path, capsys, budget):
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]
    paths[0].write_text(TRAVEL)
    paths[1].write_text(REPORT)
    code, out, _ = run(
        capsys,
        "--context",
        *map(str, paths),
        "--question",
        "Who approved the budget?",
        "--router",
        "pruner-ctx",
        *budget,
        "--json",
    )
    res = json.loads(out)
    r = load_router("pruner-ctx")
    top = max(range(len(res["scores"])), key=res["scores"].__getitem__)
    relative = budget[0] == "--keep" and r.keep_rule == "relative"
    cut = 0.3 if budget[0] == "--threshold" else r.keep_auto * (res["scores"][top] if relative else 1)
    assert code == 0 and ANSWERING in res["pruned_text"] and res["kept"]
    near = range(top - r.neighbours, top + r.neighbours + 1)  # the best unit and the neighbours kept with it
    assert all(res["scores"][i] >= cut or i in near for i in res["kept"])  # nothing else below the cut
    assert res["kept_fraction"] < 1 and not any(n.startswith("the passages are") for n in res["notes"])


@needs_smol
@shares_smol
def test_several_passages_one_budget_json_and_text(tmp_path, capsys):
    d = tmp_path / "passages"
    d.mkdir()
    (d / "1-report.txt").write_text(REPORT)
    (d / "2-travel.txt").write_text(TRAVEL)
    code, out, _ = run(
        capsys, "--context", str(d), "--question", "Who approved the budget?", "--target-tokens", "40", "--json"
    )
    res = json.loads(out)
    assert (
        code == 0 and res["compressed_tokens"] <= 40 and res["ratio"] == res["origin_tokens"] / res["compressed_tokens"]
    )
    assert [p["index"] for p in res["passages"]] == [0, 1] and res["passages"][0]["rank"] == 0
    assert (
        ANSWERING in res["pruned_text"] and sum(p["kept_tokens"] for p in res["passages"]) == res["compressed_tokens"]
    )
    # the passages' order, not a router's judgement, is checked: dense keeps both facts of this two-part question
    code, out, err = run(
        capsys,
        "--context",
        str(d / "2-travel.txt"),
        str(d / "1-report.txt"),
        "--question",
        "Who approved the budget, and who works as a baker?",
        "--keep",
        "0.2",
        "--router",
        "dense",
    )
    text, summary = out, err
    assert code == 0 and text.index("baker") < text.index("Daniel Reyes") and "\n\n" in text  # passages in order
    assert text.index("2-travel.txt <==") < text.index("baker") < text.index("1-report.txt <==")
    assert "of 2 passages" in summary


@needs_smol
@shares_smol
def test_a_budget_below_the_top_unit_says_so_and_an_empty_answer_is_named(tmp_path, capsys, monkeypatch):
    from masklab.context import answer  # compress.answer imports it when it answers

    path = tmp_path / "tiny.txt"
    path.write_text("The budget was approved by Daniel Reyes. It rained.")
    monkeypatch.setattr(answer, "generate_answer", lambda *a, **k: {"generated": "\nQuestion: Who?\n", "seconds": 0.1})
    code, out, err = run(
        capsys, "--context", str(path), "--question", "Who approved the budget?", "--keep", "0.25", "--answer"
    )
    assert code == 0 and "note: --keep 0.25 kept " in err and "the top unit is always kept" in err
    assert out.rstrip().endswith("(empty answer)")


@needs_smol
@shares_smol
def test_the_pruned_answer_is_printed_before_the_whole_document_is_answered(tmp_path, capsys, monkeypatch):
    from masklab.context import answer, cli as context_cli

    calls = []
    real = answer.generate_answer

    def recorded(*args, **kwargs):
        calls.append(capsys.readouterr())  # what the user had seen when this answer started
        return real(*args, **kwargs)

    monkeypatch.setattr(answer, "generate_answer", recorded)
    monkeypatch.setattr(context_cli, "LONG_DOCUMENT_TOKENS", 10)
    path = tmp_path / "ctx.txt"
    path.write_text(REPORT)
    code, out, err = run(
        capsys,
        "--context",
        str(path),
        "--question",
        "Who approved the budget?",
        "--answer",
        "--compare-full",
        "--max-new-tokens",
        "4",
    )
    assert code == 0 and len(calls) == 2
    assert f"answer ({DEFAULT_ROUTER} at keep 0.25" in calls[1].out and "answer (full document" in out
    assert calls[1].err.startswith("answering from the whole document (") and "tokens)..." in calls[1].err
