"""Gold recall of the lexical router on the long-context tasks (no model run, tokenizer only).

    PYTHONPATH=. python scripts/longctx_lexical_recall.py [--model smollm2-135m] [--examples 20] [--json PATH]

For each task, length (512..4096 model tokens) and kept fraction (0.1, 0.25): the share of
examples whose gold sentences all survive the `lexical` router (`masklab/context/routers/lexical.py`).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from masklab.context.routers.lexical import Lexical  # noqa: E402
from masklab.text.selection import select  # noqa: E402
from masklab.pretrained.models import load  # noqa: E402
from masklab.lab.tasks.longctx import TASKS, make_examples  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="the model whose tokenizer measures lengths")
    ap.add_argument("--examples", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    tok = load(a.model).tokenizer  # builds the model's cache on a new machine (it read an existing one only)
    rows = []
    for n in (512, 1024, 2048, 4096):
        for task in TASKS:
            exs = make_examples(task, n, a.examples, seed=0, tokenizer=tok)
            for keep in (0.1, 0.25):
                hit = []
                for e in exs:
                    k = select(Lexical().score(e, e.question), e.lengths(tok), keep)
                    hit.append(all(g in k for g in e.gold))
                rows.append({"task": task, "length": n, "keep": keep, "gold_recall": sum(hit) / len(hit)})
                print(f"{task:9s} {n:5d} keep {keep:.2f}: all gold kept in {sum(hit)}/{len(hit)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "command": f"PYTHONPATH=. python scripts/longctx_lexical_recall.py --model {a.model} "
                    f"--examples {a.examples}",
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
