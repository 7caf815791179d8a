"""Every bad input of issue 31 (a new user's trial) is one clear line, exit 2, no traceback,
and nothing left behind; the former hangs are refused within seconds.

Cases from the commands run through ``masklab.cli.main`` in this process (a traceback would
escape as an exception and fail the test); a few run as real subprocesses to check what the
user sees on stderr. Cases that need a real model's window are marked slow.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import needs_hf, needs_smol, tiny_model
from masklab import cli
from masklab.util.errors import MasklabError
from masklab.lab.routers.registry import prune_one

ROOT = Path(__file__).resolve().parents[1]


def refused(argv: list[str], capsys, match: str, out: Path | None = None) -> str:
    """``masklab ARGV`` exits 2 with exactly one ``masklab: error:`` line containing ``match``
    and nothing else on stderr; ``out`` (its --out) is not created."""
    t0 = time.perf_counter()
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's own errors (a bad number, an unknown command) exit from parse_args
        rc = e.code
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("masklab: error: "), err
    assert "Traceback" not in err
    assert match in lines[0], lines[0]
    assert time.perf_counter() - t0 < 30  # refused before any run or model load
    if out is not None:
        assert not out.exists(), f"a refused command created {out}"
    return lines[0]


@pytest.fixture
def files(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "ok.txt").write_text("Alice moved to Berlin. Bob lives in Paris. The sky was grey.\n")
    (d / "binary.dat").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    (d / "latin1.txt").write_bytes("Caf\xe9 au lait. Bob lives in Paris.\n".encode("latin-1"))
    (d / "notamodel").mkdir()
    (d / "notamodel" / "weights.txt").write_text("nothing here")
    return d


def cite(files: Path, *extra: str, context: str = "ok.txt", query: str = "Where does Bob live?") -> list[str]:
    return ["cite", "--context", str(files / context), "--query", query, *extra]


# --------------------------------------------------------------------------- tracebacks (cases 1-9)
def test_1_longctx_threads_0_with_one_run(files, tmp_path, capsys):
    out = tmp_path / "lc"
    refused(
        ["longctx", "--tasks", "niah", "--threads", "0", "--out", str(out)],
        capsys,
        "--threads must be >= 1, got 0",
        out,
    )


def test_2_longctx_model_folder_that_is_not_a_model(files, tmp_path, capsys):
    out = tmp_path / "lc"
    refused(
        ["longctx", "--tasks", "niah", "--model", str(files / "notamodel"), "--out", str(out)],
        capsys,
        "holds no config.json",
        out,
    )


@pytest.mark.parametrize("methods", ["prior", "base,prior"])  # one run or two: the same error, before any run
def test_3_tune_prior_negative_lr(methods, tmp_path, capsys):
    out = tmp_path / "tp"
    line = refused(["tune-prior", "--method", methods, "--lr", "-1", "--out", str(out)], capsys, "", out)
    assert line == "masklab: error: --lr must be > 0, got -1"


def test_4_cite_binary_file(files, capsys):
    refused(cite(files, context="binary.dat"), capsys, "looks binary")


def test_5_cite_latin1_file(files, capsys):
    refused(
        cite(files, context="latin1.txt"),
        capsys,
        "is not valid UTF-8 text (byte 3: b'\\xe9'); convert it or pass --encoding",
    )


def test_6_cite_max_new_tokens_0(files, capsys):
    refused(cite(files, "--max-new-tokens", "0"), capsys, "--max-new-tokens must be >= 1, got 0")


def test_7_cite_threads_0(files, capsys):
    refused(cite(files, "--threads", "0"), capsys, "--threads must be >= 1, got 0")


@needs_hf
def test_8_prior_factory_with_the_wrong_head_count():
    from masklab.priors.bias import RelativePrior
    from masklab.pretrained.hf import attach_priors, priors_of

    model = tiny_model("llama")
    with pytest.raises(
        MasklabError, match=r"gives shape \(5, 2, 2\) .* expected \(4 or 1, 2, 2\): the model has 4 attention heads"
    ):
        attach_priors(model, lambda layer, heads: RelativePrior(heads + 1))
    assert not priors_of(model)  # nothing attached


def test_9_a_router_trained_for_another_model_is_refused_by_its_width():
    from masklab.lab.linear_routers import fit_linear

    X, y = torch.randn(20, 6, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1] * 10)
    router = fit_linear(X, y, steps=5)  # 6 features per unit (one model's width)
    with pytest.raises(
        MasklabError, match="this router takes 6 features per unit, got 9: it was trained for another model"
    ):
        router.score(torch.randn(3, 9))


# --------------------------------------------------------------------------- silent or hung (cases 10-21)
@pytest.mark.parametrize("query", ["", "   "])
def test_10_11_cite_empty_question(files, capsys, query):
    refused(cite(files, query=query), capsys, "the question is empty")


def test_12_cite_negative_tolerance(files, capsys):
    refused(cite(files, "--tolerance", "-1"), capsys, "--tolerance must be >= 0, got -1")


def test_13_cite_text_without_sentence_punctuation_is_chunked_with_a_note(capsys):
    from masklab.lab.tasks.base import CHUNK_WORDS
    from masklab.pretrained.cli import sentences_of

    text = " ".join(f"word{i}" for i in range(5 * CHUNK_WORDS))
    items = sentences_of(text)
    assert len(items) == 5 and all(len(s.split()) == CHUNK_WORDS for s in items)
    assert "no sentence punctuation" in capsys.readouterr().err
    assert sentences_of("One sentence. Another one here.") == ["One sentence.", "Another one here."]
    assert capsys.readouterr().err == ""
    sentences_of("just a few words without a full stop")
    assert "single sentence, so it is trivially the evidence" in capsys.readouterr().err


@needs_smol
@pytest.mark.slow
def test_14_cite_context_past_the_window_is_refused_with_its_token_count(tmp_path):
    """As on a new machine (a real process, every cache empty): the first load de-quantises
    SmolLM2 before the window can be measured, and stderr is still the one line."""
    path = tmp_path / "long.txt"
    path.write_text(" ".join(f"The fox number {i} jumped over the fence." for i in range(1000)))  # ~12k tokens, 43 KB
    cold = tmp_path / "cold"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "MASKLAB_CACHE": str(cold / "masklab"),
        "HF_HOME": str(cold / "hf"),
        "XDG_CACHE_HOME": str(cold / "xdg"),
    }
    p = subprocess.run(
        [sys.executable, "-m", "masklab", "cite", "--context", str(path), "--query", "Which fox?"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [x for x in p.stderr.replace("\r", "\n").splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("masklab: error: "), p.stderr
    assert "past smollm2-135m's window of 8,192 positions" in lines[0], lines[0]
    assert "the prompt is " in lines[0] and "tokens" in lines[0]
    assert (cold / "masklab" / "models" / "smollm2-135m" / "ready.json").exists()  # it was a first load


def test_15_cite_very_large_file_is_refused_before_loading(tmp_path, capsys):
    path = tmp_path / "big.txt"
    path.write_text("Bob lives in Paris. " * 250_000)  # 5 MB
    line = refused(["cite", "--context", str(path), "--query", "Where?"], capsys, "over the limit of 1,000,000")
    assert "--max-context-bytes" in line


def test_16_tune_prior_zero_steps(tmp_path, capsys):
    out = tmp_path / "tp"
    refused(["tune-prior", "--steps", "0", "--out", str(out)], capsys, "--steps must be >= 1, got 0", out)


def test_17_evidence_prior_fraction_out_of_range(tmp_path, capsys):
    out = tmp_path / "ep"
    refused(
        ["evidence-prior", "--task", "cyclic3", "--fraction", "2", "--out", str(out)],
        capsys,
        "--fraction must be in (0, 1), got 2",
        out,
    )


@needs_hf
def test_18_prior_bias_of_the_wrong_shape_is_refused_not_broadcast():
    from masklab.pretrained.hf import attach_priors

    class Flat(torch.nn.Module):  # right head count, wrong query axis
        def forward(self, Tq, Tk, offset):
            return torch.zeros(4, 1, Tk)

    model = tiny_model("llama")
    attach_priors(model, lambda layer, heads: Flat())
    with pytest.raises(MasklabError, match=r"returned shape \(4, 1, 8\); expected \(4 or 1, 8, 8\)"):
        model(torch.randint(3, 60, (1, 8)))


@needs_hf
def test_19_hide_spans_past_the_sequence():
    from masklab.pretrained.hf import hide

    model = tiny_model("llama")
    ids = torch.randint(3, 60, (1, 8))
    with pytest.raises(MasklabError, match="hidden positions reach 20 but the sequence has 8 tokens"):
        with hide(model, spans=[(5, 20)]):
            model(ids)
    with hide(model, spans=[(2, 8)]):  # inside the sequence: fine
        model(ids)


# cases 20-21: evidence_router_press is now masklab.context's Router.choose (the lead's package)
@pytest.mark.parametrize("keep", [0, -0.5, 1.5])
def test_20_keep_outside_0_1_is_refused(keep):
    from masklab.text.selection import check_keep

    with pytest.raises(MasklabError, match=r"keep must be a fraction in \(0, 1\]"):
        check_keep(keep)


def test_21_no_sentences_is_refused():
    from masklab.text.document import Document
    from masklab.context.routers import load_router

    router = load_router("lexical")
    with pytest.raises(MasklabError, match="no units to keep"):
        prune_one(router, Document(units=[], spans=[], source=""), "Where?", keep=0.5)


# --------------------------------------------------------------------------- also found
def test_bad_values_caught_before_any_run(tmp_path, capsys):
    out = tmp_path / "tp"
    refused(
        ["tune-prior", "--method", "lora", "--lora-targets", "nope_proj", "--out", str(out)],
        capsys,
        "--lora-targets: unknown projection(s) nope_proj",
        out,
    )


def test_a_run_failing_in_process_is_one_line_with_its_log_like_a_workers(tmp_path):
    from masklab.lab.runner import RunSpec, run_study

    bad = RunSpec("2parity", "mask", 0, {})  # gotu's run_one raises KeyError on the missing params
    msgs = []
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}"
        with pytest.raises(MasklabError) as e:
            run_study(
                "gotu",
                {},
                [bad, RunSpec("2parity", "mask", 1, {})],
                "masklab.lab.studies.gotu:run_one",
                out,
                jobs=jobs,
                progress=False,
            )
        msg = str(e.value)
        assert "\n" not in msg and re.match(r"a run failed: 2parity__mask__s[01]: KeyError: '\w+' \(its log: ", msg), (
            msg
        )
        log = Path(msg.split("its log: ")[1].split(";")[0])
        assert log.exists() and "Traceback" in log.read_text()
        msgs.append(re.sub(r"s[01]", "sN", msg.replace(str(out), "OUT")))
    assert msgs[0] == msgs[1]  # the same line whether the run ran in-process or in a worker


def test_interrupted_cite_does_not_claim_runs_to_resume(monkeypatch, files, capsys):
    from masklab.pretrained import cli as pretrained_cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrained_cli, "main", interrupted)
    assert cli.main(cite(files)) == 130
    assert capsys.readouterr().err == "masklab: interrupted\n"


def test_help_shows_the_ranges(capsys):
    for argv, want in [
        (["cite", "--help"], ">= 0"),
        (["tune-prior", "--help"], "(default 200; >= 1)"),
        (["evidence-prior", "--help"], "in (0, 1)"),
    ]:
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert want in " ".join(capsys.readouterr().out.split()), argv


def test_quick_results_open_with_a_smoke_test_line():
    from masklab.lab.studies import tune_prior

    note = cli.smoke_test_note(tune_prior, tune_prior.quick_config(), {"summary": [{"n": 1}, {"n": 1}]})
    assert (
        note.startswith("> **Smoke test** (`--quick`)") and "n = 1" in note and "test_prompts 20 (default 100)" in note
    )


def test_what_the_user_sees_is_one_line(files, tmp_path):
    """As a real process: stderr is one line, exit 2 (no traceback printed anywhere)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    for argv in (cite(files, context="latin1.txt"), ["tune-prior", "--lr", "-1", "--out", str(tmp_path / "x")]):
        p = subprocess.run(
            [sys.executable, "-m", "masklab", *argv], capture_output=True, text=True, env=env, timeout=120
        )
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("masklab: error: "), p.stderr
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------- a newcomer's list (compress, help, Ctrl-C)
@pytest.fixture
def passages(tmp_path):
    d = tmp_path / "passages"
    d.mkdir()
    (d / "a.txt").write_text("Alice moved to Berlin. The sky was grey.\n")
    (d / "b.txt").write_text("Bob lives in Paris. He likes trains.\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (tmp_path / "bad.json").write_text('["Bob lives in Paris.", ]')
    (tmp_path / "numbers.json").write_text('["Bob lives in Paris.", 3]')
    return d


def compress(files: Path, *extra: str) -> list[str]:
    # a model that does not exist: each refusal below must come before any model is looked up
    return [
        "compress",
        "--context",
        str(files / "ok.txt"),
        "--question",
        "Where does Bob live?",
        "--model",
        "no-such",
        *extra,
    ]


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--keep", "abc"], "--keep takes a fraction in (0, 1] or auto, got 'abc'"),
        (["--keep", "auto", "--router", "bm25"], "--keep auto needs a router that decides how much to keep"),
        (["--target-tokens", "many"], "argument --target-tokens: invalid int value: 'many'"),
        (["--target-tokens", "0"], "--target-tokens must be >= 1, got 0"),
        (["--router", "oracle-gold"], "unknown router 'oracle-gold'"),  # a lab reference (masklab.lab.routers)
        (["--router", "pruner-attention"], "unknown router 'pruner-attention'"),  # a lab control
        (["--router", "nope"], "unknown router 'nope'"),
        (["--threshold", "0.5", "--router", "bm25"], "--threshold needs a router that decides how much to keep"),
        (["--threshold", "1.5", "--router", "pruner-ctx"], "the threshold of pruner-ctx must be a number in [0, 1]"),
        (["--threshold", "-2", "--router", "pruner"], "the threshold of pruner must be a number in [-1, 1]"),
        (["--threshold", "x"], "argument --threshold: invalid float value: 'x'"),
        (["--threshold", "0.5", "--target-tokens", "40", "--router", "pruner"], "--threshold and --target-tokens"),
        (["--int8", "--router", "bm25"], "--int8 quantises the pruner's encoder"),
    ],
)
def test_compress_options_are_one_line(files, capsys, extra, match):
    refused(compress(files, *extra), capsys, match)


@pytest.mark.parametrize(
    "context,extra,match",
    [
        (
            ["{d}"],
            ["--router", "snapkv", "--answer"],
            "snapkv is a KV-cache press: it prunes the model's cache and keeps no text; it cannot spend one budget",
        ),
        (["{d}"], ["--html", "page.html"], "--html shows one document"),
        (["{t}/empty"], [], "holds no text files"),
        (["{t}/bad.json"], [], "starts with [ but is not a valid JSON list"),
        (["{t}/numbers.json"], [], "passage 1 is a JSON int, not a string"),
        (["-", "-"], [], "standard input (-) can be read once"),
    ],
)
def test_several_passages_refused_before_the_model_loads(passages, tmp_path, capsys, context, extra, match):
    ctx = [c.format(d=passages, t=tmp_path) for c in context]
    refused(["compress", "--context", *ctx, "--question", "Who?", "--model", "no-such", *extra], capsys, match)


def test_several_passages_are_read_in_order(passages, tmp_path, monkeypatch):
    import io

    from masklab.text.inputs import read_passages

    a, b = (passages / "a.txt").read_text(), (passages / "b.txt").read_text()

    def read(sources):
        got = read_passages(sources)
        return got.texts, got.several

    assert read([str(passages / "a.txt")]) == ([a], False)  # one file: one document, as before
    assert read([str(passages / "b.txt"), str(passages / "a.txt")]) == ([b, a], True)
    (passages / ".hidden").write_text("not read")
    (passages / "z.bin").write_bytes(b"\x00\x01binary")
    got = read_passages([str(passages)])
    assert (got.texts, got.several) == ([a, b], True)  # a folder: its text files sorted by name
    assert got.names == [str(passages / "a.txt"), str(passages / "b.txt")]
    assert got.skipped == [
        f"{passages}: 1 hidden file not read (.hidden)",
        f"{passages}: 1 binary file not read (z.bin)",
    ]
    (tmp_path / "list.json").write_text(json.dumps(["one passage", "two passages"]))
    got = read_passages([str(tmp_path / "list.json")])
    assert (got.texts, got.several) == (["one passage", "two passages"], True)
    assert got.names == [f"{tmp_path / 'list.json'}[0]", f"{tmp_path / 'list.json'}[1]"]
    (tmp_path / "doc.json").write_text('{"a": "json document"}')  # not a list: one document, as before
    assert read([str(tmp_path / "doc.json")]) == (['{"a": "json document"}'], False)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b' ["from stdin", "second"]')))
    assert read(["-"]) == (["from stdin", "second"], True)
    with pytest.raises(MasklabError, match="together, over the limit of 50"):
        read_passages([str(passages / "a.txt"), str(passages / "b.txt")], max_bytes=50)


@pytest.mark.parametrize(
    "encoding,bom,given",
    [
        ("utf-16", b"", None),
        ("utf-32", b"", None),  # Python's utf-16/utf-32 write a BOM
        ("utf-16-le", b"\xff\xfe", None),
        ("utf-16-be", b"\xfe\xff", None),
        ("utf-16-le", b"", "utf-16-le"),
        ("utf-16", b"", "utf-16"),
    ],
)
def test_utf16_and_utf32_text_is_read_not_refused_as_binary(tmp_path, encoding, bom, given):
    from masklab.text.inputs import read_text

    text = "Caf\u00e9 au lait. Bob lives in Paris \u2014 near the station.\n"
    path = tmp_path / "wide.txt"
    path.write_bytes(bom + text.encode(encoding))
    assert read_text(str(path), given) == text


def test_utf16_without_a_bom_says_how_to_read_it(tmp_path, capsys):
    path = tmp_path / "wide.txt"
    path.write_bytes("Bob lives in Paris.".encode("utf-16-le"))
    refused(
        ["compress", "--context", str(path), "--question", "Who?", "--model", "no-such"],
        capsys,
        "pass --encoding utf-16-le",
    )


@pytest.mark.parametrize(
    "generated,shown",
    [
        (" Daniel Reyes.\nQuestion: Who approved it?\nAnswer: Daniel", "Daniel Reyes."),
        (" Daniel Reyes\nQuestion: Who approved it?", "Daniel Reyes"),
        (" Daniel Reyes Question: Who approved it?", "Daniel Reyes"),
        (" Daniel Reyes, the president. He signed it.", "Daniel Reyes, the president."),
        (" It cost 3.5 million euros", "It cost 3.5 million euros"),
        ("\n\nQuestion: Who approved the budget?\n", ""),
        (" Answer: Vila Nova.", "Vila Nova."),
        ("", ""),
    ],
)
def test_answers_are_their_first_line_or_sentence_and_never_a_new_question(generated, shown):
    from masklab.context.answer import first_answer

    assert first_answer(generated) == shown


def test_oversized_counts_have_a_declared_bound(tmp_path, capsys):
    out = tmp_path / "lc"
    refused(
        ["longctx", "--examples", "10000000000000", "--out", str(out)], capsys, "--examples must be in [1, 10000]", out
    )
    refused(
        ["longctx", "--train-examples", "10000000000000", "--out", str(out)], capsys, "--train-examples must be", out
    )


def test_any_bad_number_is_one_line_not_the_usage(tmp_path, capsys):
    out = tmp_path / "g"
    refused(
        ["gotu", "--steps", "x", "--out", str(out)],
        capsys,
        "argument --steps: invalid int value: 'x' (see `masklab gotu --help`)",
        out,
    )
    refused(["gotu", "--jobs", "two", "--out", str(out)], capsys, "argument --jobs: invalid int value: 'two'", out)
    refused(["nope"], capsys, "argument COMMAND: invalid choice: 'nope'")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_out_that_root_may_write_by_its_mode_but_cannot_create_is_one_line(capsys):
    # root passes os.access on /proc, but nothing can be created there (the regression)
    refused(
        ["gotu", "--task", "2parity", "--method", "mask", "--quick", "--out", "/proc/x/y"],
        capsys,
        "cannot create the output directory /proc/x/y: /proc takes no new folders",
    )


def test_an_out_that_exists_and_is_writable_is_left_as_it_was(tmp_path):
    cli.writable_dir(tmp_path)
    cli.writable_dir(tmp_path / "new" / "deeper")
    assert list(tmp_path.iterdir()) == []  # the probe folder is removed, --out is not created


def test_help_lists_the_commands_for_your_documents_first(capsys):
    import argparse

    ap = cli.build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    listed = [a.dest for a in sub._choices_actions]  # the order --help lists them in
    assert listed[:6] == ["compress", "train-router", "serve", "models", "cite", "realdocs"], listed
    assert listed.index("gotu") > 5 and "your own documents" in " ".join(ap.format_help().split())


def test_list_routers_says_what_each_router_reads_and_needs(capsys):
    assert cli.main(["compress", "--list-routers"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "reads no model" in lines["bm25"] and "reads no model" in lines["lexical"]
    assert "reads the model" in lines["evidence"] and "--answer" not in lines["evidence"]
    assert (
        "reads the model" in lines["snapkv"]
        and "needs --answer" in lines["snapkv"]
        and "needs --answer" in lines["finch"]
    )
    assert not {"oracle-gold", "longllmlingua", "attention", "pruner-attention", "pruner-marks"} & set(
        lines
    )  # the lab's
    assert "reads no model" in lines["dense"] and "reads no model" in lines["pruner"]
    from masklab.context.router import DEFAULT_ROUTER

    assert "for: any document: MiniLM fine-tuned" in out  # the pruner's use
    assert lines[DEFAULT_ROUTER].endswith("; the default") and out.count("the default") == 1  # named once, rightly
    assert "for: real documents where facts are restated" in out


def test_ctrl_c_while_the_command_imports_is_one_line_and_130(monkeypatch, capsys):
    import masklab.__main__ as entry

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)  # Ctrl-C while the studies import
    assert cli.main(["compress", "--list-routers"]) == 130
    assert capsys.readouterr().err == "masklab: interrupted\n"
    monkeypatch.setattr(cli, "main", interrupted)  # anywhere else the entry point runs
    assert entry.run() == 130
    assert capsys.readouterr().err == "masklab: interrupted\n"
