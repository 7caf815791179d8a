"""The command line generated from the config dataclasses (masklab/util/flags.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

import pytest

from cli_cases import CASES, GOLDEN, resolve
from masklab import cli
from masklab.util import flags
from masklab.util.errors import MasklabError

EXPECTED = json.loads(GOLDEN.read_text())
# fields added after the golden file was written, with the default that keeps the old behaviour
ADDED = {
    "prompt_format": None,
    "min_teacher_acc": 0.5,
    "attention_k": "25%",
    "fractions": ["10%", "25%"],
    "teacher_per_seed": True,
}


def without_added(config):
    """``config`` (a dict from asdict, nested for `pretrained`) less the ADDED fields at their defaults."""
    if not isinstance(config, dict):
        return config
    return {k: without_added(v) for k, v in config.items() if not (k in ADDED and v == ADDED[k])}


@pytest.mark.parametrize("argv", CASES, ids=" ".join)
def test_same_config_as_the_hand_written_command_line(argv):
    """Every representative command line resolves to the config (or the error) it gave
    before the flags were generated (tests/data/cli_configs.json, from commit 6b6707c)."""
    want = EXPECTED[" ".join(argv)]
    if "error" in want:  # the subcommand `route` is now `routing` (route is an alias)
        want = {"error": want["error"].replace("masklab route:", "masklab routing:")}
    got = resolve(argv)
    if "error" in got:  # argparse's usage errors are now one `masklab: error:` line naming PROG's --help
        got["error"] = re.sub(r"masklab: error: (.*) \(see `(.*) --help`\)$", r"\2: error: \1", got["error"])
    if argv[0] == "arith" and "config" in want:  # arith's warmup was 100 steps; now a fraction, as in lm and vision
        assert got["config"].pop("warmup") == (0.25 if "--quick" in argv else 0.04)
        assert want["config"].pop("warmup") == 100
    if "config" in got:
        got["config"] = without_added(got["config"])
    assert got == want


def test_warmup_is_a_fraction_everywhere_and_arith_keeps_its_100_steps():
    from masklab.lab.studies import arith, lm, vision

    for mod in (arith, lm, vision):
        assert flags.flags_of(mod.Config)[0] and isinstance(mod.Config().warmup, float)
    for cfg in (arith.quick_config(), arith.reproduce_config()):  # the runs behind the published numbers
        assert max(1, int(cfg.warmup * cfg.steps)) == 100


@pytest.mark.parametrize("name", sorted(cli.STUDIES))
def test_every_flag_has_help_with_its_default(name):
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices[name]._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{name} {action.option_strings} has no help"
            if action.dest not in ("quick", "no_progress", "seed"):
                assert "(default " in action.help, f"{name} {action.option_strings}: {action.help}"


def test_flag_declared_once_sets_its_field_and_only_when_given():
    @dataclasses.dataclass
    class C:
        names: list[str] = flags.flag(factory=lambda: ["a"], name="--name", help="names")
        size: int = flags.flag(3, help="size")
        allowed: float = flags.strength_flag(6.0)
        suppressed: float = 6.0
        on: bool = flags.flag(False, help="switch")

    ap = argparse.ArgumentParser()
    flags.add_flags(ap, C)
    assert "(default a)" in ap.format_help() and "(default 3)" in ap.format_help()
    base = C(size=7)
    assert flags.config_from_args(ap.parse_args([]), base) == base  # nothing given: the base, not the defaults
    got = flags.config_from_args(ap.parse_args(["--name", "x,y", "--strength", "4,8", "--on"]), base)
    assert got == C(names=["x", "y"], size=7, allowed=4.0, suppressed=8.0, on=True)
    with pytest.raises(MasklabError, match="--strength takes one or two positive numbers"):
        flags.config_from_args(ap.parse_args(["--strength", "1,2,3"]), base)


def test_old_route_command_still_works_and_is_not_listed():
    assert cli.build_parser().parse_args(cli._unalias(["route", "--quick"])).study == "masklab.lab.studies.routing"
    assert cli.build_parser().parse_args(cli._unalias(["reproduce", "route"])).name == "routing"
    assert "route " not in cli.build_parser().format_help().replace("routing", "")


def test_bad_value_is_one_error_line_and_exit_2(capsys):
    assert cli.main(["gotu", "--support", "a,b", "--out", "unused"]) == 2
    assert capsys.readouterr().err == "masklab: error: expected comma-separated integers, got 'a,b'\n"


def test_an_output_directory_that_cannot_be_created_is_one_clear_error(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    rc = cli.main(
        ["gotu", "--quick", "--task", "cyclic3", "--method", "vanilla", "--steps", "1", "--out", str(blocker / "x")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"masklab: error: cannot create the output directory {blocker / 'x'}: Not a directory"]
