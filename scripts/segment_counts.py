"""Units of ``segment`` on real documents, before and after a change: a Markdown table.

    python scripts/segment_counts.py --before f6c0646 --json results/segment-counts/results.json

For each document of the real-document benchmark (``masklab/data/realdocs/docs``: licences,
FAQs, release notes, changelogs, man pages, Python's docs and READMEs, copied from files every
Debian/Python machine has), it counts the units ``masklab.text.document.segment`` makes (no tokenizer:
words and punctuation marks are the tokens) and the *labels* among them: units of at most
3 tokens that are only a number, a list or FAQ marker, or a heading (:func:`is_label`),
with the ``segment`` of git revision ``--before`` (its masklab/text/document.py) and
with this checkout's. ``--json`` also writes the counts (one summary row per document and
way, ``task`` = document, ``method`` = before/after, and the totals as task ``all``), which
docs/context.md quotes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from masklab.text.document import segment, word_offsets  # noqa: E402

_MARKER = r"(?:[-*+•·#=~_|>]+|\(?\d{1,3}(?:\.\d{1,3})*[.):]?|\(\w{1,4}\)|[A-Za-z][.):])"
_MARKERS_ONLY = re.compile(rf"{_MARKER}(?:\s+{_MARKER})*")
_SENTENCE = re.compile(r"\w+\W+\w.*[.!?][\"')\]]*", re.S)  # two words or more, then . ! or ?


def is_label(unit: str) -> bool:
    """A unit of at most 3 tokens (:func:`word_offsets`) that is only a number or marker
    ("2.", "Q.", "(a)", "-") or a heading: anything short that is not a sentence of two
    words or more ("Definitions.", "## Install", "DESCRIPTION", "Then")."""
    unit = unit.strip()
    if len(word_offsets(unit)) > 3:
        return False
    return bool(_MARKERS_ONLY.fullmatch(unit)) or not _SENTENCE.fullmatch(unit)


def documents() -> dict[str, str]:
    """Name -> text of each document of the real-document benchmark."""
    from masklab.lab.tasks.realdocs import ROOT as BENCH

    return {p.stem: p.read_text(encoding="utf-8") for p in sorted((BENCH / "docs").glob("*.txt"))}


def segment_at(rev: str):
    """The ``segment`` function of ``masklab/text/document.py`` at git revision ``rev`` (before it moved
    there, ``masklab/context/document.py``)."""
    for path in ("masklab/text/document.py", "masklab/context/document.py"):
        r = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
        if r.returncode == 0:
            src = r.stdout
            break
    else:
        raise SystemExit(f"segment_counts: cannot read masklab/text/document.py at {rev!r}: {r.stderr.strip()}")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    try:
        spec = importlib.util.spec_from_file_location("document_before", f.name)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
    finally:
        os.unlink(f.name)
    return mod.segment


def counts(before, docs: dict[str, str]) -> list[dict]:
    """Summary rows: units and labels per document, before and after, and their totals."""
    rows = []
    for name, text in docs.items():
        for way, seg in (("before", before), ("after", segment)):
            units = seg(text).units
            rows.append({"task": name, "method": way, "units": len(units), "labels": sum(map(is_label, units))})
    for way in ("before", "after"):
        mine = [r for r in rows if r["method"] == way]
        rows.append(
            {
                "task": "all",
                "method": way,
                "units": sum(r["units"] for r in mine),
                "labels": sum(r["labels"] for r in mine),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    out = ["| document | units before | labels before | units after | labels after |", "|---|---:|---:|---:|---:|"]
    by = {(r["task"], r["method"]): r for r in rows}
    for name in dict.fromkeys(r["task"] for r in rows):
        b, a = by[(name, "before")], by[(name, "after")]
        out.append(f"| {name} | {b['units']} | {b['labels']} | {a['units']} | {a['labels']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--before", default="main", help="git revision whose segment gives the 'before' columns (default: main)"
    )
    ap.add_argument("--json", metavar="FILE", help="also write the counts as a results file")
    a = ap.parse_args()
    rows = counts(segment_at(a.before), documents())
    print(table(rows))
    if a.json:
        import json

        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        cmd = f"python scripts/segment_counts.py --before {a.before} --json {a.json}"
        Path(a.json).write_text(json.dumps({"command": cmd, "before": a.before, "summary": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
