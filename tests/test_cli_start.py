"""A start in seconds: ``masklab compress``, ``serve`` and ``masklab.context.prune`` import no module of
the lab (checked in a fresh interpreter), the subcommand table builds only the chosen command's parser
while ``masklab --help`` lists every command with its module's help, and a router that reads only a
tokenizer reads no model weights (they load only for an answer or a router that reads the model)."""

import argparse
import dataclasses
import importlib
import json
import subprocess
import sys

import pytest

from conftest import HAVE_SMOL, needs_hf, needs_smol, save_tiny_folder
from masklab import cli

FRESH = r"""
import json, sys
from masklab.cli import main

def mods():
    return sorted(sys.modules)

out = {}
try:
    main(["compress", "--help"])
except SystemExit:
    pass
out["help"] = mods()
import masklab.context.cli, masklab.context.serve  # noqa: E401
from masklab.context import load_router, prune  # noqa: F401
import masklab.context.routers  # noqa: F401
out["imports"] = mods()
if len(sys.argv) > 1:
    main(["compress", "--context", sys.argv[1], "--question", "Who approved the budget?", "--router", "bm25"])
    out["bm25"] = mods()
print("\n" + json.dumps(out))
"""


def fresh_modules(tmp_path, run_bm25: bool) -> dict[str, list[str]]:
    """The modules a fresh interpreter holds after ``compress --help``, after importing the product's
    entry points, and (``run_bm25``) after a ``compress --router bm25`` call."""
    args = [sys.executable, "-c", FRESH]
    if run_bm25:
        doc = tmp_path / "doc.txt"
        doc.write_text("The board met in March. The budget was approved by Daniel Reyes. The roof leaks.\n")
        args.append(str(doc))
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_product_imports_no_lab_module_and_help_no_torch(tmp_path):
    seen = fresh_modules(tmp_path, run_bm25=HAVE_SMOL)
    for stage, modules in seen.items():
        lab = [m for m in modules if m == "masklab.lab" or m.startswith("masklab.lab.")]
        assert not lab, (stage, lab)
    assert "torch" not in seen["help"] and "numpy" not in seen["help"]  # the parser alone
    if HAVE_SMOL:  # the tokenizer alone: no model class, no generation code, no scikit-learn
        heavy = {"sklearn", "transformers.generation.utils", "transformers.modeling_utils"} & set(seen["bm25"])
        assert not heavy, heavy


def test_help_lists_every_command_with_the_help_its_module_declares():
    def listed(ap):
        sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
        return [(a.dest, a.help) for a in sub._choices_actions]

    full, lazy = listed(cli.build_parser()), listed(cli.build_parser("compress"))
    assert lazy == full and len(full) == len(cli.COMMANDS) + len(cli.STUDIES) + len(cli.TOOLS)
    for name, module in cli.STUDIES.items():  # a study's help is its docstring's first line
        assert cli.STUDY_HELP[name] == importlib.import_module(module).__doc__.strip().splitlines()[0], name
    lazy_help = cli.build_parser("").format_help()
    assert all(name in lazy_help for name in [*cli.COMMANDS, *cli.STUDIES, *cli.TOOLS])


def test_a_command_parses_with_only_its_own_parser_built():
    ap = cli.build_parser("compress")
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    assert sub.choices["gotu"]._actions[1:] == []  # listed, not built: only -h
    args = ap.parse_args(["compress", "--context", "a.txt", "--question", "Who?", "--router", "bm25"])
    assert args.router == "bm25" and args.device == "auto"
    assert cli.build_parser("gotu").parse_args(["gotu", "--quick"]).study == cli.STUDIES["gotu"]


def test_the_precisions_the_parser_offers_are_the_devices():
    from masklab.util import device

    assert cli.PRECISIONS == device.PRECISIONS


@needs_hf
def test_a_model_folder_reads_its_weights_when_first_asked_for(tmp_path, monkeypatch):
    from masklab.pretrained import models

    reads = []
    real = models._read_weights
    monkeypatch.setattr(models, "_read_weights", lambda *a, **k: reads.append(1) or real(*a, **k))
    folder = save_tiny_folder(tmp_path / "tiny", "llama")
    lm = models.load(str(folder))
    assert not lm.weights_loaded and reads == []
    assert lm.n_layers == 2 and lm.config.max_position_embeddings == 256  # from config.json alone
    copy = dataclasses.replace(lm, prompt_format="raw")
    assert lm.model.config.num_hidden_layers == 2 and lm.weights_loaded and reads == [1]
    assert copy.model is lm.model and reads == [1]  # a copy shares the weights, read once


@needs_smol
def test_a_router_that_reads_only_the_tokenizer_reads_no_weights(tmp_path, monkeypatch, capsys):
    from masklab.pretrained import models

    def refused(*args, **kwargs):
        raise RuntimeError("the model's weights were read")

    monkeypatch.setattr(models, "_read_weights", refused)
    doc = tmp_path / "doc.txt"
    doc.write_text("The board met in March. The budget was approved by Daniel Reyes. The roof leaks.\n")
    ask = ["compress", "--context", str(doc), "--question", "Who approved the budget?"]
    assert cli.main([*ask, "--router", "bm25"]) == 0
    assert "Daniel Reyes" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="weights were read"):  # an answer reads the model
        cli.main([*ask, "--router", "bm25", "--answer"])
