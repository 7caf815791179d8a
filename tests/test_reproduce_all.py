"""scripts/reproduce_all.py: every folder under results/ has one entry, every masklab step of
an entry parses as the script runs it (with the --out, --jobs and --no-progress it adds) and
writes inside results/NAME, and the steps that read the frozen realdocs test split run only
when named. Parsing only: nothing runs."""

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import pytest

from masklab.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("reproduce_all", ROOT / "scripts" / "reproduce_all.py")
ra = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ra)


def test_every_results_folder_has_one_entry():
    names = [r.name for r in ra.REPRODUCTIONS]
    assert len(names) == len(set(names))
    folders = sorted(p.name for p in (ROOT / "results").iterdir() if p.is_dir())
    assert [f for f in folders if f not in names] == [], "folders under results/ with no entry in REPRODUCTIONS"


def test_every_step_parses_and_writes_inside_its_folder():
    parser = build_parser()
    reads_test = set()
    for r in ra.REPRODUCTIONS:
        assert r.steps, r.name
        for step in r.steps:
            assert not {"--jobs", "--no-progress", "--progress"} & set(step), f"{r.name}: reproduce_all adds these"
            if step[0].startswith("scripts/"):
                assert (ROOT / step[0]).is_file(), f"{r.name}: no {step[0]}"
                continue
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    args = parser.parse_args(ra.masklab_args(r.name, step, jobs=2, keep_old_runs=True))
            except SystemExit:
                pytest.fail(f"{r.name}: masklab {' '.join(step)}: {err.getvalue().strip()}")
            folder = Path("results", r.name)
            assert Path(args.out) == folder or folder in Path(args.out).parents, f"{r.name} writes into {args.out}"
            if args.command == "realdocs" and args.split.startswith("test"):
                reads_test.add(r.name)
    assert reads_test == {r.name for r in ra.REPRODUCTIONS if r.explicit}


def test_the_run_of_all_leaves_out_the_explicit_entries(monkeypatch):
    ran = []
    monkeypatch.setattr(ra, "run", lambda r, jobs, keep_old_runs: ran.append(r.name) or 0)
    monkeypatch.setattr(sys, "argv", ["reproduce_all.py"])
    assert ra.main() == 0
    assert ran == [r.name for r in ra.REPRODUCTIONS if not r.explicit]
    explicit = next(r.name for r in ra.REPRODUCTIONS if r.explicit)
    ran.clear()
    monkeypatch.setattr(sys, "argv", ["reproduce_all.py", explicit])
    assert ra.main() == 0
    assert ran == [explicit]


def test_every_run_in_results_records_its_code():
    """A run record (a study's ``runs``, a realdocs row's ``stamp``) without the code that made
    it cannot be judged current or stale: such runs are kept in docs/archive/, not results/."""
    import json

    missing = []
    for path in sorted((ROOT / "results").rglob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            continue
        records = list(data.get("runs") or []) + [
            r["stamp"] for r in data.get("rows") or [] if isinstance(r, dict) and "stamp" in r
        ]
        if any(not (r.get("code") or r.get("code_ast")) for r in records):
            missing.append(str(path.relative_to(ROOT)))
    assert missing == []
