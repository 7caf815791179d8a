"""Merge writers' folders (each: ``docs/``, ``questions/``, ``sources.json``) into a benchmark or
corpus folder: copies their documents and questions, adds their sources to ``sources.json``,
``split.json`` and ``SOURCES.md``, then validates the result (masklab.lab.tasks.realdocs). A
document or question file that already exists is refused, so a writer cannot overwrite another's;
a document no question reads is left out.

    python scripts/merge_writers.py --into masklab/data/corpus STAGING_DIR...
    python -m masklab.lab.tasks.realdocs --root masklab/data/corpus --check --freeze
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def merge(into: Path, staging: Path) -> list[str]:
    """Copy one writer's folder into ``into``; the names of the documents added."""
    spec = json.loads((staging / "sources.json").read_text())
    target = into / "sources.json"
    have = json.loads(target.read_text()) if target.exists() else {"chars": spec["chars"], "docs": {}}
    split_path = into / "split.json"
    split = json.loads(split_path.read_text()) if split_path.exists() else {}
    used = {p.stem for p in (staging / "questions").glob("*.jsonl")}
    for f in (staging / "questions").glob("multi-*.jsonl"):
        used |= {p["doc"] for line in f.read_text().splitlines() if line.strip() for p in json.loads(line)["passages"]}
    spec["docs"] = {k: v for k, v in spec["docs"].items() if k in used}
    clash = set(spec["docs"]) & set(have["docs"])
    if clash:
        raise SystemExit(f"{staging}: documents already in {into}: {sorted(clash)}")
    for sub in ("docs", "questions"):
        (into / sub).mkdir(parents=True, exist_ok=True)
        for f in sorted((staging / sub).iterdir()):
            if sub == "docs" and f.stem not in spec["docs"]:
                continue
            if (into / sub / f.name).exists():
                raise SystemExit(f"{staging}: {sub}/{f.name} already exists in {into}")
            shutil.copyfile(f, into / sub / f.name)
    rows = []
    for name, d in spec["docs"].items():
        have["docs"][name] = {**d, "chars": spec["chars"]} if spec["chars"] != have["chars"] else d
        split.setdefault(d["split"], []).append(name)
        rows.append(f"| {name} | {d['kind']} | {d['split']} | `{d['source']}` | {d['package']} | {d['terms']} |")
    target.write_text(json.dumps(have, indent=1) + "\n")
    split_path.write_text(json.dumps(split, indent=1) + "\n")
    with open(into / "SOURCES.md", "a", encoding="utf-8") as f:
        f.write("\n".join(rows) + "\n")
    return list(spec["docs"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", type=Path, required=True, help="the corpus or benchmark folder to add to")
    ap.add_argument("staging", type=Path, nargs="+", help="writers' folders")
    a = ap.parse_args()
    for s in a.staging:
        print(f"{s}: {len(merge(a.into, s))} documents")
    from masklab.lab.tasks.realdocs import _read

    _read(a.into)  # every line checked: exact, unique evidence; kinds; passages
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
