"""``masklab compress`` as a user pipes it: standard output holds only the pruned text (or the
JSON), several passages each after a line naming it, the summary and notes on standard error,
``--quiet`` leaves standard error empty; a request is checked once whatever narrows it; the page's
legend says what decided; an answer cut by ``max_new_tokens`` says so; every list of router names a
user reads is the registry's."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from conftest import needs_smol
from test_compress import ANSWERING, REPORT, TRAVEL

from masklab.cli import main
from masklab.context import Request, Router
from masklab.util.errors import MasklabError

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Who approved the budget?"
shares_smol = pytest.mark.usefixtures("shared_loads")


def run(capsys, *argv):
    code = main(["compress", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def as_json(capsys, *argv) -> dict:
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    return json.loads(out)


@needs_smol
@shares_smol
def test_stdout_holds_only_the_kept_text_of_one_document(tmp_path, capsys, monkeypatch):
    path = tmp_path / "minutes.txt"
    path.write_text(REPORT)
    argv = ("--context", str(path), "--question", QUESTION, "--router", "bm25", "--keep", "0.3")
    res = as_json(capsys, *argv)
    code, out, err = run(capsys, *argv)
    assert code == 0 and out == res["pruned_text"] + "\n" and ANSWERING in out  # the kept text and nothing else
    assert err.startswith(f"kept {len(res['kept'])} of {len(res['units'])} units") and "router bm25" in err
    from masklab.context.routers.bm25 import BM25

    real = BM25.score

    def warns(self, doc, question):
        warnings.warn("a library's deprecation warning", DeprecationWarning, stacklevel=1)
        return real(self, doc, question)

    monkeypatch.setattr(BM25, "score", warns)
    with warnings.catch_warnings(record=True) as shown:  # what would reach stderr outside pytest
        warnings.simplefilter("always")
        code, out_quiet, err_quiet = run(capsys, *argv, "--quiet")
    assert code == 0 and out_quiet == out and err_quiet == "" and not shown  # no library warning either


@needs_smol
@shares_smol
def test_stdout_names_each_passage_and_a_folder_read_says_what_it_skipped(tmp_path, capsys):
    folder = tmp_path / "notes"
    (folder / "old").mkdir(parents=True)
    (folder / "1-minutes.txt").write_text(REPORT)
    (folder / "2-travel.txt").write_text(TRAVEL)
    (folder / ".draft").write_text("hidden")
    (folder / "scan.bin").write_bytes(b"\x00\x01\x02")
    argv = ("--context", str(folder), "--question", "Who approved the budget, and who works as a baker?")
    argv += ("--router", "bm25", "--keep", "0.3")
    res = as_json(capsys, *argv)
    names = [str(folder / "1-minutes.txt"), str(folder / "2-travel.txt")]
    assert [p["source"] for p in res["passages"]] == names
    assert all(p["kept_units"] for p in res["passages"])  # both passages keep a fact
    code, out, err = run(capsys, *argv)
    blocks = [f"==> {p['source']} <==\n{p['text']}" for p in res["passages"]]
    assert code == 0 and out == "\n\n".join(blocks) + "\n"
    for skipped in (
        "1 subfolder not read (old)",
        "1 hidden file not read (.draft)",
        "1 binary file not read (scan.bin)",
    ):
        assert f"note: {folder}: {skipped}" in err and skipped in " ".join(res["notes"])
    assert "of 2 passages" in err.splitlines()[0]
    code, _, err = run(capsys, *argv, "--quiet")
    assert code == 0 and err == ""
    # a JSON list's passages are named by their index in it
    (tmp_path / "list.json").write_text(json.dumps([REPORT, TRAVEL]))
    res = as_json(capsys, "--context", str(tmp_path / "list.json"), *argv[2:])
    assert [p["source"] for p in res["passages"]] == [f"{tmp_path / 'list.json'}[{i}]" for i in range(2)]


def test_a_request_without_names_has_each_passage_by_its_index():
    from masklab.context.routers.lexical import Lexical

    out = Lexical().prune(Request(QUESTION, [REPORT, TRAVEL], fraction=0.3)).to_json()
    assert [p["source"] for p in out["passages"]] == [0, 1]
    with pytest.raises(MasklabError, match="1 passage names for 2 passages"):
        Request(QUESTION, [REPORT, TRAVEL], sources=["a.txt"])


@needs_smol
@shares_smol
def test_a_cli_request_is_checked_once(tmp_path, capsys, monkeypatch):
    """Made once by the command, then narrowed (the window's cap) without checking it all again:
    one full check, each passage's text checked (and its bytes counted) once."""
    from masklab.context import router

    counts = {"request": 0, "context": 0}
    post_init, check_context = Request.__post_init__, router.check_context

    def counted_init(self):
        counts["request"] += 1
        post_init(self)

    def counted_context(*args, **kwargs):
        counts["context"] += 1
        return check_context(*args, **kwargs)

    monkeypatch.setattr(Request, "__post_init__", counted_init)
    monkeypatch.setattr(router, "check_context", counted_context)
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]
    paths[0].write_text(REPORT)
    paths[1].write_text(TRAVEL)
    code, _, _ = run(capsys, "--context", *map(str, paths), "--question", QUESTION, "--router", "bm25", "--quiet")
    assert code == 0 and counts == {"request": 1, "context": 2}


def test_a_served_request_is_checked_once(monkeypatch):
    from masklab.context import router, serve
    from masklab.context.compress import fit_window

    counts = {"request": 0, "context": 0}
    post_init, check_context = Request.__post_init__, router.check_context
    monkeypatch.setattr(
        Request, "__post_init__", lambda self: (counts.update(request=counts["request"] + 1), post_init(self))
    )
    monkeypatch.setattr(
        router,
        "check_context",
        lambda *a, **k: (counts.update(context=counts["context"] + 1), check_context(*a, **k))[1],
    )
    body = {"context": [REPORT, TRAVEL], "question": QUESTION, "router": "bm25"}
    req = serve.parse_request(json.dumps(body).encode(), serve.ServeConfig())
    assert req.request.size == len(REPORT.encode()) + len(TRAVEL.encode())

    class Window:  # a model's window, as fit_window reads it
        name = "m"
        config = type("C", (), {"max_position_embeddings": 2048})()  # read without the weights (LoadedModel.config)

        @staticmethod
        def tokenizer(text):
            return {"input_ids": text.split()}

    narrowed, _, _ = fit_window(req.request, Window, 48)
    assert narrowed.cap is not None and narrowed.passages == req.request.passages
    assert counts == {"request": 1, "context": 2}  # each passage once, in the one check
    with pytest.raises(MasklabError, match="over the limit of 100"):
        serve.parse_request(json.dumps(body).encode(), serve.ServeConfig(max_context_bytes=100))


def test_with_checks_only_the_field_it_changes():
    req = Request(QUESTION, [REPORT, TRAVEL], fraction=0.3, sources=["a", "b"])
    assert req.with_(cap=10).cap == 10 and req.with_(cap=10).sources == ("a", "b")
    assert req.with_(question="  Who?  ").question == "Who?"
    with pytest.raises(MasklabError, match="question is empty"):
        req.with_(question=" ")
    with pytest.raises(MasklabError, match="passage 1 of the context is empty"):
        req.with_(passages=["text", " "])
    assert req.with_(passages=["one"]).sources == ()  # new passages drop the old names
    with pytest.raises(TypeError, match="not fraction"):
        req.with_(fraction=2.0)  # a budget is changed by making a new request, checked in full


class Fixed(Router):
    """Scores set by the test (words count the tokens: no model)."""

    name = "fixed"
    scores: list[float] = []

    def score(self, doc, question):
        return torch.tensor(self.scores[: len(doc.units)])


def test_the_page_legend_says_what_decided_and_why_a_lower_unit_is_kept():
    from masklab.context.html import page

    units = ["Short best one.", " ".join(["A long second unit"] * 10) + ".", "Tiny low one."]
    Fixed.scores = [0.9, 0.5, 0.1]
    pruned = Fixed().prune(Request(QUESTION, "\n\n".join(units), tokens=8, router=Fixed))
    assert pruned.kept == [0, 2]  # the long unit does not fit what is left; the tiny one does
    text = page(pruned, QUESTION)
    assert "target_tokens 8: units best score first while they fit in 8 tokens" in text
    assert 'class="unit kept fitted" data-unit="2"' in text and "that one was longer than what was left" in text
    assert 'class="unit dropped" data-unit="1"' in text and 'class="unit kept" data-unit="0"' in text
    Fixed.neighbours = 1
    try:
        pruned = Fixed().prune(Request(QUESTION, "\n\n".join(units), fraction=1.0, router=Fixed))
    finally:
        del Fixed.neighbours
    text = page(pruned, QUESTION)
    assert 'class="unit kept near" data-unit="1"' in text and "the 1 unit on each side of the best unit" in text
    assert "fitted" not in text.split("</header>")[1]


def test_an_answer_cut_by_max_new_tokens_says_so():
    from masklab.context.answer import CUT, shown_answer

    cut = "It means the lease, which is not a go"  # the token cut split the last word
    assert shown_answer(cut, "length") == "It means the lease, which is not a" + CUT
    assert shown_answer("Daniel Reyes. He also", "length") == "Daniel Reyes."  # a whole sentence: nothing cut
    assert shown_answer("Daniel Reyes", "eos") == "Daniel Reyes"  # the model ended it
    assert shown_answer("Daniel Reyes\nQuestion: more", "length") == "Daniel Reyes"  # its first line ended
    assert shown_answer("Reyes", "length") == "Reyes" + CUT


def help_texts(command: str) -> dict[str, str]:
    from masklab.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.choices and command in a.choices).choices[command]
    return {a.option_strings[0]: a.help or "" for a in sub._actions if a.option_strings}


@pytest.mark.parametrize("command", ["compress", "serve"])
def test_help_shows_no_empty_default(command):
    helps = help_texts(command)
    assert not [f for f, h in helps.items() if "(default )" in h or "default ;" in h]
    if command == "compress":
        assert helps["--question"].endswith("(required)")


def test_each_shared_flag_is_declared_once():
    from masklab.context.cli import CompressConfig
    from masklab.context.compress import SharedFlags
    from masklab.context.serve import ServeConfig

    own = {n for cls in (CompressConfig, ServeConfig) for n in vars(cls).get("__annotations__", {})}
    shared = set(SharedFlags.__annotations__)
    assert own & shared == set() and {"keep", "router", "max_new_tokens", "max_context_bytes"} <= shared


def test_an_unknown_router_is_refused_with_every_name_list_routers_shows(capsys):
    from masklab.context.cli import list_routers

    list_routers()
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line and not line.startswith(" ")]
    with pytest.raises(MasklabError) as e:
        Request(QUESTION, REPORT, router="nope")
    named = re.search(r"choose from (.*?) \(", str(e.value)).group(1).split(", ")
    assert named == listed


def test_every_list_of_router_names_a_user_reads_is_the_registrys():
    """The prose lists (README's compress section, the integrations' and masklab.context's
    docstrings) name only product routers and, where they list them, every one."""
    import masklab.context
    import masklab.integrations
    from masklab.context.presses import PRESSES
    from masklab.context.routers import ROUTERS
    from masklab.lab.routers import LAB_ROUTERS, REWRITERS

    def named(text: str) -> set[str]:
        words = set(re.findall(r"`?([a-z0-9]+(?:[-+][a-z0-9]+)*)`?", text))
        return words & (set(ROUTERS) | set(LAB_ROUTERS) | set(REWRITERS))

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("Routers (`masklab compress --list-routers`)") :].split("\n\n")[0]
    assert named(section) == set(ROUTERS), "README's list of routers"
    assert "kvpress" in section and PRESSES
    for module in (masklab.context, masklab.integrations):
        assert named(module.__doc__) <= set(ROUTERS), module.__name__
    for path in (ROOT / "masklab" / "integrations").glob("*.py"):
        assert named(path.read_text()) <= set(ROUTERS), path.name


def test_what_a_weights_file_carries_is_read_in_one_place(tmp_path):
    """``keep_auto``, ``keep_rule``, ``neighbours``: the request checks what the router built from the
    same file will use (Router.capabilities)."""
    from masklab.context.routers import load_router
    from masklab.context.routers.pruner import ContextPruner, WEIGHTS

    r = load_router("pruner-ctx")
    assert {k: getattr(r, k) for k in ("keep_auto", "keep_rule", "neighbours", "hops")} == ContextPruner.capabilities()
    meta = json.loads((WEIGHTS / "ctx-union.json").read_text())
    assert ContextPruner.capabilities()["neighbours"] == meta["context"]
    # a file with no keep_auto: keep="auto" is refused when the request is made, before any router loads
    (tmp_path / "head.safetensors").write_bytes((WEIGHTS / "ctx-union.safetensors").read_bytes())
    (tmp_path / "head.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "keep_auto"}))
    with pytest.raises(MasklabError, match="carries none"):
        Request.of(
            QUESTION, REPORT, keep="auto", router="pruner-ctx", options={"path": str(tmp_path / "head.safetensors")}
        )


def test_the_service_documents_every_request_field():
    from masklab.context.serve import FIELDS

    from masklab.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.choices and "serve" in a.choices).choices["serve"]
    assert all(f"{f}:" in sub.epilog for f in FIELDS)
    docs = (ROOT / "docs" / "context.md").read_text()
    table = docs[docs.index("## The service: `masklab serve`") :]
    rows = re.findall(r"^\| `([a-z_]+)` \|", table.split("\n\n### ")[0], flags=re.M)
    assert set(FIELDS) <= set(rows)
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"`POST /v1/compress` takes `\{(.*?)\}`", readme, flags=re.S).group(1)
    assert [w.strip(" ?\n").split(":")[0] for w in said.split(",")] == list(FIELDS)


def test_a_press_renders_through_the_one_json_shape():
    """A kvpress press keeps no text: the same keys as every result (docs/context.md), nulls where
    it keeps nothing."""
    from test_result_keys import where

    from masklab.context.router import Pruned
    from masklab.text.document import segment

    doc = segment(REPORT, None)
    req = Request(QUESTION, REPORT, fraction=0.3, router="snapkv")
    out = Pruned(doc, [], [], doc.lengths(None), 0.0, "snapkv", request=req, cache_fraction=0.3).to_json()
    assert set(out) == where("all")
    assert out["kept"] is out["pruned_text"] is out["passages"] is out["router_seconds"] is None
    assert out["kept_fraction"] == 0.3 and out["keep"] == 0.3 and out["router"] == "snapkv"


def test_the_routers_an_option_names_are_those_that_take_it():
    """Where help or an integration names the routers an option is for, they are the registry's."""
    from masklab.context.router import takers

    def named(text: str) -> set[str]:
        from masklab.context.routers import ROUTERS

        return set(re.findall(r"[a-z0-9]+(?:[-+][a-z0-9]+)*", text)) & set(ROUTERS)

    assert named(help_texts("compress")["--threshold"]) == set(takers("score_range"))
    for path in (ROOT / "masklab" / "integrations").glob("*.py"):
        for line in path.read_text().splitlines():
            if "embedder" in line and named(line):
                assert named(line) == set(takers("embedder")), (path.name, line)
