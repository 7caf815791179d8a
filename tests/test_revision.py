"""Which code made a run: per-study code hashes, re-running runs made by other code,
checkpoints stamped with their code, and tables that say when they mix code."""

from pathlib import Path

import pytest

from masklab import runner
from masklab.report import code_note, environment_line, markdown_table
from masklab.revision import closure, code_hash, import_graph
from masklab.runner import claim_checkpoint, read_json, run_study, write_json
from masklab.studies.gotu import Config, specs_for

TINY = dict(tasks=["2parity"], methods=["mask"], seeds=[0, 1], steps=30, evals=3, width=16, depth=1, heads=2, batch=32)
FN = "masklab.studies.gotu:run_one"


def package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "masklab"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_hash_covers_what_a_module_imports_and_nothing_else(tmp_path):
    pkg = package(tmp_path, {
        "a.py": "from masklab import b\n",
        "b.py": "def f():\n    from masklab.c import g\n",  # a lazy import counts too
        "c.py": "def g(): return 1\n",
        "other.py": "x = 1\n",
    })
    assert closure("masklab.a", import_graph(pkg)) == ["masklab", "masklab.a", "masklab.b", "masklab.c"]
    before = code_hash("masklab.a", pkg)
    (pkg / "other.py").write_text("x = 2\n")
    assert code_hash("masklab.a", pkg) == before  # an unrelated module leaves a study's runs valid
    (pkg / "c.py").write_text("def g(): return 2\n")
    assert code_hash("masklab.a", pkg) != before  # a module reached through two imports does not


def test_runs_made_by_other_code_are_run_again_unless_kept(tmp_path):
    specs = specs_for(Config(**TINY))
    first = run_study("gotu", {}, specs, FN, tmp_path, progress=False)
    code = first["runs"][0]["code"]
    assert first["code"] == {code: 2} and first["runs"][0]["git_rev"] is not None
    # pretend seed 1 was made by older code
    path = tmp_path / "runs" / f"{specs[1].key}.json"
    write_json(path, {**read_json(path), "code": "0ld0ld0ld0ld", "seconds": -1.0})
    runner.KEEP_OLD_RUNS = True
    try:
        kept = run_study("gotu", {}, specs, FN, tmp_path, progress=False)
    finally:
        runner.KEEP_OLD_RUNS = False
    assert kept["runs"][1]["seconds"] == -1.0 and kept["code"] == {code: 1, "0ld0ld0ld0ld": 1}
    assert "mixes runs made by different code" in environment_line(kept)  # every results.md's footer
    redone = run_study("gotu", {}, specs, FN, tmp_path, progress=False)
    assert redone["runs"][1]["seconds"] >= 0 and redone["code"] == {code: 2}
    assert redone["runs"][1]["metrics"] == first["runs"][1]["metrics"]
    assert code_note(redone) == ""


def test_a_checkpoint_from_other_code_is_not_resumed(tmp_path):
    ckpt = tmp_path / "ckpt" / "k"
    claim_checkpoint(ckpt, "aaa")
    (ckpt / "ckpt.json").write_text("{}")
    claim_checkpoint(ckpt, "aaa")
    assert (ckpt / "ckpt.json").exists()  # same code: resume
    claim_checkpoint(ckpt, "bbb")
    assert not (ckpt / "ckpt.json").exists() and (ckpt / "code.txt").read_text().strip() == "bbb"


@pytest.mark.parametrize("n, cell", [(1, "0.500"), (2, "0.500 ± 0.100")])
def test_one_run_prints_no_spread(n, cell):
    row = {"task": "t", "method": "m", "n": n, "acc_mean": 0.5, "acc_std": None if n == 1 else 0.1}
    assert markdown_table([row], [], ["acc"]).splitlines()[-1] == f"| t | m | {n} | {cell} | - |"
