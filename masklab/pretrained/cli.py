"""``masklab models`` and ``masklab cite``: the two pretrained commands that are not studies."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from masklab.errors import MasklabError


def add_cite_parser(sub) -> None:
    p = sub.add_parser("cite", help="which sentences of a context a pretrained LM's answer causally depends on")
    p.add_argument("--model", default="smollm2-135m", help="registered name (see `masklab models`), model directory or .gguf file (default %(default)s)")
    p.add_argument("--context", required=True, help="text file with the context")
    p.add_argument("--query", required=True, help="the question")
    p.add_argument("--method", default="group-testing", help="evidence search: loo, greedy-minimal, group-testing, or contextcite (default %(default)s)")
    p.add_argument("--hide", default="mask", choices=["mask", "delete"], help="hide a sentence by masking its tokens' keys or by deleting it (default %(default)s)")
    p.add_argument("--tolerance", type=float, default=1.0, help="answer 'holds' while its log-probability drops by less than this (nats) and it stays the greedy answer (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=8, help="answer length in tokens (default %(default)s)")
    p.add_argument("--prompt-format", choices=["raw", "chat"], default=None,
                   help="raw completion or the model's chat turns (default: the model's own, see `masklab models`)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _models(args: argparse.Namespace) -> int:
    from masklab.pretrained.models import load, model_table

    rows = model_table()
    width = max(len(r["model"]) for r in rows)
    for r in rows:
        state = ("installed" if r["installed"] else "missing") + (", cached" if r["cached"] else "")
        print(f"{r['model']:<{width}}  {state:<18}  {r['description']}  (prompt format: {r['prompt_format']})")
        if not r["installed"]:
            print(f"{'':<{width}}  install: {r['install']}")
    print("also accepted wherever --model is: a local Hugging Face model directory or a .gguf file")
    if args.load:
        lm = load(args.load, threads=args.threads if hasattr(args, "threads") else None, device=args.device)
        print(f"loaded {args.load} from {lm.source} in {lm.load_seconds:.1f} s "
              f"({lm.n_layers} layers x {lm.n_heads} heads)")
    return 0


def _cite(args: argparse.Namespace) -> int:
    from masklab.pretrained.evidence import cite
    from masklab.pretrained.models import load

    path = Path(args.context)
    if not path.is_file():
        raise MasklabError(f"context file {path} does not exist")
    from masklab import device as devices

    dev = devices.resolve(args.device)  # one clear error for --device cuda without a GPU, before loading
    lm = load(args.model, threads=args.threads, prompt_format=args.prompt_format, device=dev)
    with devices.autocast(dev, args.precision):
        res = cite(lm, path.read_text(), args.query, method=args.method, hide=args.hide,
                   tolerance=args.tolerance, max_new_tokens=args.max_new_tokens)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"answer: {res['answer']!r}  (log-prob {res['answer_logprob']:.2f}, prompt format {lm.prompt_format})")
    print(f"method: {res['method']}  forward passes: {res['forward_passes']}  seconds: {res['seconds']:.1f}")
    for i, s in enumerate(res["sentences"]):
        mark = "*" if i in res["evidence"] else " "
        score = res["scores"][i] if res.get("scores") else None
        extra = f"{score:+.2f}  " if score is not None else ""
        print(f" {mark} [{i}] {extra}{s}")
    return 0


def main(args: argparse.Namespace) -> int:
    return _models(args) if args.command == "models" else _cite(args)
