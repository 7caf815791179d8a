"""Tables and numbers in README.md and docs/ are generated from results files, and the
repository's copies match what their files generate."""

from pathlib import Path

import pytest

from masklab.lab import doctables
from masklab.cli import main
from masklab.util.errors import MasklabError
from masklab.util.files import write_json

REPO = Path(__file__).resolve().parents[1]
RESULTS = {
    "summary": [
        {"task": "cyclic3", "method": "vanilla", "n": 3, "acc_mean": 0.41, "acc_std": 0.04},
        {"task": "cyclic3", "method": "mask", "n": 3, "acc_mean": 0.98, "acc_std": 0.01},
        {"task": "maj3", "method": "mask", "n": 1, "acc_mean": 1.0, "acc_std": None},
    ],
    "environment": {"git_rev": "abc1234"},
    "code": {"c0de": 7},
    "command": "masklab reproduce gotu --out results/gotu",
    "bench": {"rows": [{"speedup": 3.25}]},
}


def repo(tmp_path: Path, doc: str) -> Path:
    write_json(tmp_path / "results" / "gotu" / "results.json", RESULTS)
    (tmp_path / "README.md").write_text(doc)
    return tmp_path


def test_every_generated_block_in_the_repository_matches_its_results_file():
    assert doctables.update(REPO, check=True) == [], "run `masklab report` and commit the regenerated docs"


def test_a_table_is_generated_from_the_rows_its_filters_select(tmp_path):
    root = repo(
        tmp_path,
        "Before.\n<!-- table results/gotu/results.json metrics=acc task=cyclic3 -->\nstale\n<!-- /table -->\nAfter.\n",
    )
    assert doctables.update(root) == [root / "README.md"]
    text = (root / "README.md").read_text()
    assert "| vanilla | 3 | 0.410 ± 0.040 |" in text and "| mask | 3 | 0.980 ± 0.010 |" in text
    assert "maj3" not in text.split("<!-- /table -->")[0].split("-->", 1)[1]
    assert "masklab reproduce gotu --out results/gotu" in text and "c0de" in text
    assert text.startswith("Before.\n") and text.endswith("After.\n")
    assert doctables.update(root, check=True) == []  # regenerated: nothing differs


def test_a_hand_edited_number_is_caught(tmp_path):
    root = repo(
        tmp_path,
        "<!-- value results/gotu/results.json metric=acc task=cyclic3 method=mask digits=2 --><!-- /value -->\n",
    )
    doctables.update(root)
    text = (root / "README.md").read_text()
    assert "-->0.98 ± 0.01<!--" in text
    (root / "README.md").write_text(text.replace("0.98", "0.99"))
    assert doctables.update(root, check=True) == [root / "README.md"]
    assert main(["report", "--check", "--root", str(root)]) == 1
    assert main(["report", "--root", str(root)]) == 0 and "0.98" in (root / "README.md").read_text()


def test_values_by_key_path_and_single_runs_without_spread(tmp_path):
    root = repo(
        tmp_path,
        "x <!-- value results/gotu/results.json key=bench.rows.0.speedup digits=1 --><!-- /value -->x "
        "<!-- value results/gotu/results.json metric=acc task=maj3 --><!-- /value -->\n",
    )
    doctables.update(root)
    assert (root / "README.md").read_text() == (
        "x <!-- value results/gotu/results.json key=bench.rows.0.speedup digits=1 -->3.2<!-- /value -->x "
        "<!-- value results/gotu/results.json metric=acc task=maj3 -->1.000<!-- /value -->\n"
    )


def test_a_value_over_another_method_is_their_ratio(tmp_path):
    root = repo(
        tmp_path,
        "<!-- value results/gotu/results.json metric=acc task=cyclic3 method=mask over=vanilla digits=2 -->"
        "<!-- /value -->\n",
    )
    doctables.update(root)
    assert "-->2.39<!--" in (root / "README.md").read_text()  # 0.98 / 0.41, not 0.41 / 0.98


def test_blocks_in_fenced_code_are_examples_and_left_alone(tmp_path):
    doc = (
        "```\n<!-- table results/nope.json metrics=acc -->\n<!-- /table -->\n```\n"
        "<!-- value results/gotu/results.json key=code.c0de --><!-- /value -->\n"
    )
    root = repo(tmp_path, doc)
    doctables.update(root)
    assert (root / "README.md").read_text() == doc.replace("--><!-- /value", "-->7<!-- /value")


@pytest.mark.parametrize(
    "block, message",
    [
        ("<!-- table results/gotu/results.json metrics=acc colour=red --><!-- /table -->", "bad option 'colour=red'"),
        ("<!-- table results/nope.json metrics=acc --><!-- /table -->", "results/nope.json does not exist"),
        ("<!-- value results/gotu/results.json metric=acc task=cyclic3 --><!-- /value -->", "select 2 summary rows"),
        ("<!-- value results/gotu/results.json key=bench.rows.5 --><!-- /value -->", "has no bench.rows.5"),
        ("<!-- table results/gotu/results.json metrics=acc -->\n| a |\n", "not closed"),
    ],
)
def test_bad_blocks_are_one_clear_error_naming_the_place(tmp_path, block, message, capsys):
    root = repo(tmp_path, "line one\n" + block + "\n")
    with pytest.raises(MasklabError, match=message):
        doctables.update(root)
    assert main(["report", "--root", str(root)]) == 2
    assert "README.md:2" in capsys.readouterr().err or "not closed" in message


def test_results_made_by_other_code_are_listed_as_stale(tmp_path, capsys):
    from masklab.lab.revision import code_ast

    today = code_ast("masklab.lab.studies.gotu")
    current = {"runs": [{"code": "0123456789ab", "code_ast": today}] * 2}  # the byte hash differs, the code does not
    write_json(tmp_path / "results" / "gotu" / "results.json", current)
    write_json(tmp_path / "results" / "gotu" / "wall.json", {"invocations": []})  # no code: as its results.json
    write_json(
        tmp_path / "results" / "old" / "sub" / "results.json",
        {"runs": [current["runs"][0], {"code_ast": "ba9876543210"}]},
    )
    write_json(tmp_path / "results" / "old" / "sub" / "wall.json", {"invocations": []})
    (tmp_path / "README.md").write_text(
        "".join(
            f"<!-- value results/{f} key=invocations --><!-- /value -->\n"
            for f in ("gotu/wall.json", "old/sub/wall.json")
        )
        + "<!-- value results/old/notes.json key=a --><!-- /value -->\n"
    )
    write_json(tmp_path / "results" / "old" / "notes.json", {"a": 1})  # quoted, no code, no results.json beside
    old = tmp_path / "results" / "old"
    assert doctables.stale_results(tmp_path) == [
        (old / "notes.json", "unknown", {"records no code": 1}),
        (old / "sub" / "results.json", "stale", {"code ba9876543210: code_ast ba9876543210 is no module's today": 1}),
        (old / "sub" / "wall.json", "stale", {"no code of its own; results.json beside it is stale": 1}),
    ]
    assert main(["report", "--stale", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "stale: " + str(old / "sub" / "results.json") + " (1 runs by code ba9876543210" in out.out
    assert "2 of 5 results files" in out.err and "2 stale, 1 unknown" in out.err
    (old / "sub" / "results.json").unlink()
    (old / "sub" / "wall.json").unlink()
    (tmp_path / "README.md").write_text("no blocks\n")
    assert main(["report", "--stale", "--root", str(tmp_path)]) == 0


def test_a_p_value_that_rounds_to_zero_prints_as_a_bound(tmp_path):
    write_json(
        tmp_path / "results" / "p" / "results.json",
        {
            "summary": [
                {"task": "t", "method": "a", "n": 30, "acc": 0.9, "p_full": 0.00002},
                {"task": "t", "method": "b", "n": 30, "acc": 0.0004, "p_full": 0.012},
            ],
            "tests": {"p_top": 0.0000001, "share": 0.0001},
        },
    )
    doc = (
        "<!-- value results/p/results.json metric=p_full method=a -->x<!-- /value --> "
        "<!-- value results/p/results.json metric=p_full method=b -->x<!-- /value --> "
        "<!-- value results/p/results.json key=tests.p_top digits=4 -->x<!-- /value --> "
        "<!-- value results/p/results.json key=tests.share -->x<!-- /value --> "
        "<!-- value results/p/results.json metric=acc method=b -->x<!-- /value -->\n"
        "<!-- table results/p/results.json metrics=acc,p_full -->\n<!-- /table -->\n"
    )
    (tmp_path / "README.md").write_text(doc)
    doctables.update(tmp_path)
    text = (tmp_path / "README.md").read_text()
    values = [m.group(3) for m in doctables.BLOCK.finditer(text) if m.group(1) == "value"]
    assert values == ["< 0.001", "0.012", "< 0.0001", "0.000", "0.000"]  # only p-values get the bound
    assert "| a | 30 | 0.900 | < 0.001 |" in text and "| b | 30 | 0.000 | 0.012 |" in text


def test_per_question_rows_name_the_code_that_made_them(tmp_path):
    from masklab.lab.revision import code_ast

    today = code_ast("masklab.lab.realdocs")
    rows = [
        {"id": "q1", "stamp": {"code": "0123456789ab", "code_ast": today}},
        {"id": "q2", "stamp": {"code": "0123456789ab", "code_ast": "ba9876543210"}},
    ]
    write_json(tmp_path / "results" / "realdocs" / "results_test.json", {"rows": rows[:1]})
    write_json(tmp_path / "results" / "realdocs-old" / "results_test.json", {"rows": rows})
    (tmp_path / "README.md").write_text(
        "".join(
            f"<!-- value results/{f}/results_test.json key=rows --><!-- /value -->\n"
            for f in ("realdocs", "realdocs-old")
        )
    )
    assert doctables.stale_results(tmp_path) == [
        (
            tmp_path / "results" / "realdocs-old" / "results_test.json",
            "stale",
            {"code ba9876543210: code_ast ba9876543210 is no module's today": 1},
        )
    ]
