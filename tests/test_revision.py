"""Which code made a run: per-study code hashes, re-running runs made by other code,
checkpoints stamped with their code, and tables that say when they mix code."""

from pathlib import Path

import pytest

from masklab.lab import runner
from masklab.lab.report import code_note, environment_line, markdown_table
from masklab.lab.revision import Staleness, closure, code_ast, code_hash, git_rev, import_graph
from masklab.lab.runner import claim_checkpoint, read_json, run_study, write_json
from masklab.lab.studies.gotu import Config, specs_for

TINY = dict(tasks=["2parity"], methods=["mask"], seeds=[0, 1], steps=30, evals=3, width=16, depth=1, heads=2, batch=32)
FN = "masklab.lab.studies.gotu:run_one"


def package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "masklab"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_hash_covers_what_a_module_imports_and_nothing_else(tmp_path):
    pkg = package(
        tmp_path,
        {
            "a.py": "from masklab import b\n",
            "b.py": "def f():\n    from masklab.c import g\n",  # a lazy import counts too
            "c.py": "def g(): return 1\n",
            "other.py": "x = 1\n",
        },
    )
    assert closure("masklab.a", import_graph(pkg)) == ["masklab", "masklab.a", "masklab.b", "masklab.c"]
    before = code_hash("masklab.a", pkg)
    (pkg / "other.py").write_text("x = 2\n")
    assert code_hash("masklab.a", pkg) == before  # an unrelated module leaves a study's runs valid
    (pkg / "c.py").write_text("def g(): return 2\n")
    assert code_hash("masklab.a", pkg) != before  # a module reached through two imports does not


STUDY = '''"""A study."""

from masklab import util


def run_one(spec, ckpt_dir):
    """One run."""
    return util.twice(spec["seed"])
'''


@pytest.mark.parametrize(
    "edit, same",
    [
        (lambda s: s.replace("def run_one", "# why it is so\ndef run_one"), True),  # a comment
        (lambda s: s.replace('"""One run."""', '"""One run, reworded."""'), True),  # a docstring
        (lambda s: s.replace('"""A study."""\n', ""), True),  # a docstring gone
        (
            lambda s: s.replace('util.twice(spec["seed"])', "util.twice(\n        spec['seed']  # the seed\n    )"),
            True,
        ),  # formatting
        (lambda s: s.replace('spec["seed"]', 'spec["seed"] + 1'), False),  # the body
        (
            lambda s: s.replace('"""One run."""', '"""One run."""\n    spec = dict(spec)'),
            False,
        ),  # a statement after the docstring
    ],
)
def test_code_ast_ignores_comments_docstrings_and_formatting(tmp_path, edit, same):
    pkg = package(
        tmp_path, {"studies/__init__.py": "", "studies/s.py": STUDY, "util.py": "def twice(x):\n    return 2 * x\n"}
    )
    before = code_hash("masklab.studies.s", pkg), code_ast("masklab.studies.s", pkg)
    assert len(before[1]) == 12 and int(before[1], 16) >= 0
    (pkg / "studies" / "s.py").write_text(edit(STUDY))
    assert code_hash("masklab.studies.s", pkg) != before[0]  # the byte hash sees every edit
    assert (code_ast("masklab.studies.s", pkg) == before[1]) == same
    (pkg / "studies" / "s.py").write_text(STUDY)
    (pkg / "util.py").write_text("def twice(x):\n    return x + x\n")  # an imported module's body counts too
    assert code_ast("masklab.studies.s", pkg) != before[1]


def git(root: Path, *args: str) -> str:
    import subprocess

    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_staleness_of_old_records_compares_the_code_at_their_revision(tmp_path):
    """A record with only the byte hash and its git revision: its code is read back from git
    and compared, normalised, with today's."""
    pkg = package(
        tmp_path, {"studies/__init__.py": "", "studies/s.py": STUDY, "util.py": "def twice(x):\n    return 2 * x\n"}
    )
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "one")
    rev, old = git(tmp_path, "rev-parse", "--short", "HEAD"), code_hash("masklab.studies.s", pkg)
    made = tmp_path / "results.json"

    def verdict(code=old, code_ast_=None, rev=rev):
        return Staleness(("masklab.studies.",), pkg).verdict(code, code_ast_, rev, made)

    assert verdict() == ("current", "")
    (pkg / "studies" / "s.py").write_text(STUDY.replace("def run_one", "# a comment\ndef run_one"))
    git(tmp_path, "commit", "-qam", "a comment")
    assert verdict() == ("current", "")  # the byte hash differs from today's; the code does not
    assert verdict(rev=None) == ("current", "")  # no revision: the commits are searched
    # a hash taken after the run, once an edit made during it was committed, is found at that later commit
    (pkg / "util.py").write_text("def twice(x):\n    return 2 * x  # same\n")
    later = code_hash("masklab.studies.s", pkg)
    git(tmp_path, "commit", "-qam", "during the run")
    assert verdict(code=later) == ("current", "")
    (pkg / "util.py").write_text("def twice(x):\n    return 3 * x\n")
    state, why = verdict()
    assert state == "stale" and "masklab.util" in why and "masklab.studies.s," not in why
    assert verdict(code="0123456789ab")[0] == "unknown" and verdict(code=None)[0] == "unknown"
    today = code_ast("masklab.studies.s", pkg)
    assert verdict(code="0123456789ab", code_ast_=today) == ("current", "")  # a new record: by code_ast, no git
    assert verdict(code_ast_="0123456789ab")[0] == "stale"


def test_runs_made_by_other_code_are_run_again_unless_kept(tmp_path):
    specs = specs_for(Config(**TINY))
    first = run_study("gotu", {}, specs, FN, tmp_path, progress=False)
    code, ast_ = first["runs"][0]["code"], first["runs"][0]["code_ast"]
    assert first["code"] == {code: 2} and first["code_ast"] == {ast_: 2} and first["runs"][0]["git_rev"] is not None
    assert ast_ == code_ast("masklab.lab.studies.gotu") and git_rev() is not None
    path = tmp_path / "runs" / f"{specs[1].key}.json"
    # made by code that differs from today's in comments only: the byte hash differs, code_ast does not: kept
    write_json(path, {**read_json(path), "code": "c0mment0nly0", "seconds": -2.0})
    assert run_study("gotu", {}, specs, FN, tmp_path, progress=False)["runs"][1]["seconds"] == -2.0
    # pretend seed 1 was made by older code, recorded before code_ast
    rec = read_json(path)
    del rec["code_ast"]
    write_json(path, {**rec, "code": "0ld0ld0ld0ld", "seconds": -1.0})
    runner.KEEP_OLD_RUNS = True
    try:
        kept = run_study("gotu", {}, specs, FN, tmp_path, progress=False)
    finally:
        runner.KEEP_OLD_RUNS = False
    assert kept["runs"][1]["seconds"] == -1.0 and kept["code"] == {code: 1, "0ld0ld0ld0ld": 1}
    assert kept["code_ast"] == {ast_: 1, "unknown": 1}
    assert "mixes runs made by different code" in environment_line(kept)  # every results.md's footer
    redone = run_study("gotu", {}, specs, FN, tmp_path, progress=False)
    assert redone["runs"][1]["seconds"] >= 0 and redone["code"] == {code: 2} and redone["code_ast"] == {ast_: 2}
    assert redone["runs"][1]["metrics"] == first["runs"][1]["metrics"]
    assert code_note(redone) == ""


def test_a_checkpoint_from_other_code_is_not_resumed(tmp_path):
    ckpt = tmp_path / "ckpt" / "k"
    claim_checkpoint(ckpt, "aaa")
    (ckpt / "ckpt.json").write_text("{}")
    claim_checkpoint(ckpt, "aaa")
    assert (ckpt / "ckpt.json").exists()  # same code: resume
    claim_checkpoint(ckpt, "ccc", also="aaa")
    assert (ckpt / "ckpt.json").exists() and (
        ckpt / "code.txt"
    ).read_text().strip() == "ccc"  # stamped with the older hash
    claim_checkpoint(ckpt, "bbb")
    assert not (ckpt / "ckpt.json").exists() and (ckpt / "code.txt").read_text().strip() == "bbb"


@pytest.mark.parametrize("n, cell", [(1, "0.500"), (2, "0.500 ± 0.100")])
def test_one_run_prints_no_spread(n, cell):
    row = {"task": "t", "method": "m", "n": n, "acc_mean": 0.5, "acc_std": None if n == 1 else 0.1}
    assert markdown_table([row], [], ["acc"]).splitlines()[-1] == f"| t | m | {n} | {cell} | - |"


def commit_titled(title: str) -> str | None:
    """The commit of this checkout whose subject starts with ``title`` (None outside git)."""
    import subprocess

    p = subprocess.run(
        ["git", "log", "--all", "--format=%H %s"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=60
    )
    return (
        next((line.split()[0] for line in p.stdout.splitlines() if line.split(" ", 1)[1].startswith(title)), None)
        if p.returncode == 0
        else None
    )


def test_the_rename_map_reads_sources_from_before_the_layout_move_as_the_move_left_them():
    """Runs made before the move keep their stamps: the sources just before it, renamed and
    rewritten by revision.after_move, are (normalised) the sources the move committed, module
    for module, so a closure of unchanged code hashes the same on either side of it."""
    from masklab.lab.revision import BOOKKEEPING, History, after_move, moved, parsed

    move = commit_titled("layout: move modules into util/")
    lazy = commit_titled("layout: masklab's lazily resolved top-level names")
    if move is None or lazy is None:
        pytest.skip("not a git checkout with the layout move's commits")
    history = History()
    parent = history.git("rev-parse", f"{move}~1").strip()
    before, after = history.sources(parent), history.sources(move)
    assert before and after and "masklab.errors" in before and "masklab.util.errors" in after
    read = after_move(before)
    # the move's own fix-ups: revision.ROOT and the benchmark's data folder (one line each), and
    # the lazily resolved names of masklab/__init__.py (their own commit); longllmlingua moved later
    later = {
        "masklab",
        "masklab.lab.tasks.realdocs",
        "masklab.context.routers",
        "masklab.lab.routers.longllmlingua",
        "masklab.context.routers.longllmlingua",
    }
    assert set(read) - later - BOOKKEEPING == set(after) - later - BOOKKEEPING
    differs = [m for m in sorted(set(after) - later - BOOKKEEPING) if parsed(read[m])[0] != parsed(after[m])[0]]
    assert differs == []
    assert parsed(read["masklab"])[0] == parsed(history.sources(lazy)["masklab"])[0]
    assert (
        moved("masklab.studies.gotu") == "masklab.lab.studies.gotu"
        and moved("masklab.context.router") == "masklab.context.router"
    )
