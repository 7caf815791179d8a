"""Units of ``segment`` on real documents, before and after a change: a Markdown table.

    PYTHONPATH=. python scripts/segment_counts.py [--before main]

For each document every Debian/Python machine has (the Apache-2.0, GPL-3 and MPL-2.0
texts in /usr/share/common-licenses, the base-files and man-db FAQs, ``man xargs`` and
``man gzip`` rendered at 80 columns, zstd's README and Python's pydoc topics "try" and
"import"), it counts the units ``masklab.context.document.segment`` makes (no tokenizer:
words and punctuation marks are the tokens) and the *labels* among them: units of at most
3 tokens that are only a number, a list or FAQ marker, or a heading (:func:`is_label`),
with the ``segment`` of git revision ``--before`` (its masklab/context/document.py) and
with this checkout's. A document that is missing here is left out.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from masklab.context.document import segment, word_offsets  # noqa: E402

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


def _man(page: str) -> str | None:
    try:
        man = subprocess.run(["man", page], capture_output=True, text=True, env={**os.environ, "MANWIDTH": "80"}, check=True)
        return subprocess.run(["col", "-bx"], input=man.stdout, capture_output=True, text=True, check=True).stdout or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _file(path: str) -> str | None:
    p = Path(path)
    if not p.is_file():
        return None
    data = p.read_bytes()
    return (gzip.decompress(data) if p.suffix == ".gz" else data).decode("utf-8")


def _pydoc(topic: str) -> str | None:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return None
    return topics.get(topic)


def documents() -> dict[str, str]:
    """Name -> text of each document present on this machine."""
    found = {
        "Apache-2.0": _file("/usr/share/common-licenses/Apache-2.0"),
        "GPL-3": _file("/usr/share/common-licenses/GPL-3"),
        "MPL-2.0": _file("/usr/share/common-licenses/MPL-2.0"),
        "base-files FAQ": _file("/usr/share/doc/base-files/FAQ"),
        "man-db FAQ": _file("/usr/share/doc/man-db/FAQ"),
        "man xargs": _man("xargs"),
        "man gzip": _man("gzip"),
        "zstd README": _file("/usr/share/doc/zstd/README.md.gz"),
        "pydoc try": _pydoc("try"),
        "pydoc import": _pydoc("import"),
    }
    return {k: v for k, v in found.items() if v and v.strip()}


def segment_at(rev: str):
    """The ``segment`` function of ``masklab/context/document.py`` at git revision ``rev``."""
    try:
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:masklab/context/document.py"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"segment_counts: cannot read masklab/context/document.py at {rev!r}: {e}")
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


def table(before, docs: dict[str, str]) -> str:
    rows = ["| document | units before | labels before | units after | labels after |", "|---|---:|---:|---:|---:|"]
    for name, text in docs.items():
        old, new = before(text).units, segment(text).units
        rows.append(f"| {name} | {len(old)} | {sum(map(is_label, old))} | {len(new)} | {sum(map(is_label, new))} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="main", help="git revision whose segment gives the 'before' columns (default: main)")
    a = ap.parse_args()
    print(table(segment_at(a.before), documents()))


if __name__ == "__main__":
    main()
