"""Representative command lines of every study, and how to resolve one to its config.

``tests/data/cli_configs.json`` holds what the command line of commit 6b6707c (before the
flags were generated from the config dataclasses) made of each of these: the resolved
config as a dict, or the error. ``test_cli_flags.py`` checks that today's command line
gives the same. Regenerate (only on purpose) with ``python tests/cli_cases.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "cli_configs.json"

CASES: list[list[str]] = [
    ["gotu"], ["gotu", "--quick"], ["gotu", "--seeds", "2"], ["gotu", "--quick", "--seed", "3"],
    ["gotu", "--task", "2parity,maj3", "--method", "mask,vanilla", "--strength", "4,8", "--steps", "10", "--lr", "0.01",
     "--batch", "16", "--weight-decay", "0.1", "--width", "32", "--depth", "1", "--heads", "2", "--design", "pairwise"],
    ["gotu", "--function", "x0*x1", "--seen", "x0==1", "--support", "0,1", "--dim", "5"],
    ["gotu", "--quick", "--strength", "5"], ["gotu", "--strength", "0"], ["gotu", "--support", "a,b"],
    ["gotu", "--design", "nope"], ["gotu", "--steps", "x"],
    ["arith"], ["arith", "--quick"], ["arith", "--op", "mul", "--fraction", "0.05"],
    ["arith", "--fraction", "add:0.004,mul:0.03"], ["arith", "--fraction", "add:0.004"],
    ["arith", "--quick", "--op", "add", "--fraction", "0.1,0.2"],
    ["arith", "--reverse", "--prior", "per-head", "--mul-window", "2", "--strength", "3,5", "--steps", "5", "--batch", "8",
     "--lr", "0.1", "--weight-decay", "0", "--dim", "16", "--depth", "1", "--heads", "2", "--test-size", "100",
     "--evals", "2", "--width", "2", "--method", "mask"],
    ["arith", "--quick", "--no-reverse"], ["arith", "--fraction", "x"], ["arith", "--fraction", "div:0.1"],
    ["arith", "--strength", "a"], ["arith", "--prior", "nope"],
    ["vision"], ["vision", "--quick"],
    ["vision", "--data", "digits", "--data-dir", "/x", "--image-size", "32", "--model", "cpu-micro", "--method", "mask,vanilla",
     "--patch", "4", "--dim", "16", "--depth", "1", "--heads", "2", "--steps", "5", "--batch", "8", "--evals", "2",
     "--lr", "0.1", "--weight-decay", "0.0", "--strength", "2"],
    ["vision", "--strength", "1,2,3"], ["vision", "--data", "nope"],
    ["lm"], ["lm", "--quick"],
    ["lm", "--corpus", "wikitext2", "--data-dir", "/d", "--max-chars", "1000", "--tokenizer", "bpe", "--bpe-vocab", "300",
     "--method", "none,causal", "--block", "16", "--dim", "8", "--depth", "1", "--heads", "2", "--steps", "3", "--batch", "4",
     "--evals", "1", "--val-windows", "5", "--lr", "0.5", "--weight-decay", "0.2", "--target-ppl", "3.5"],
    ["lm", "--quick", "--steps", "7"], ["lm", "--tokenizer", "nope"],
    ["evidence"], ["evidence", "--quick"],
    ["evidence", "--task", "kv", "--hops", "2,3", "--updates", "3", "--items", "8", "--vocab", "64", "--tags", "4",
     "--max-count", "3", "--method", "loo", "--aggregate", "rollout,layer0", "--mode", "delete", "--examples", "10",
     "--teacher-steps", "100", "--teacher-lr", "0.01", "--dim", "16", "--depth", "2", "--heads", "2", "--max-factor", "2",
     "--aux", "0.5", "--recency", "stale,kv", "--cache", "/tmp/c"],
    ["evidence", "--recency", "none"], ["evidence", "--recency", "bogus"], ["evidence", "--hops", "x"],
    ["evidence", "--mode", "nope"],
    ["stale"], ["stale", "--quick"],
    ["stale", "--model", "a,b", "--prompts", "5", "--updates", "2,4", "--filler", "1,2", "--threads", "2"],
    ["stale", "--updates", "0,3"], ["stale", "--filler", "3"],
    ["prune"], ["prune", "--quick"],
    ["prune", "--model", "m", "--task", "squad", "--squad", "/s.json", "--budget", "0.2,0.5", "--compare", "",
     "--methods", "full", "--train-prompts", "3", "--test-prompts", "4", "--filler-max", "2", "--threads", "2"],
    ["prune", "--compare", "snapkv"], ["prune", "--budget", "x"], ["prune", "--task", "nope"],
    ["pretrained"], ["pretrained", "--quick"],
    ["pretrained", "--models", "a,b", "--stale-prompts", "3", "--cite-prompts", "2", "--train-prompts", "4", "--test-prompts", "5"],
    ["route"], ["route", "--quick"],
    ["route", "--task", "kv", "--hops", "3", "--items", "8", "--targets", "causal,gold", "--independent", "attention",
     "--budget", "10%", "--budgets", "1,2", "--lengths", "1,3", "--router-dim", "8", "--router-depth", "1",
     "--router-heads", "2", "--router-steps", "9", "--router-lr", "0.1", "--no-length-scale", "--loss", "listwise",
     "--pool", "50", "--baselines", "dense,random", "--snap-aggregate", "rollout", "--examples", "7", "--vocab", "32",
     "--updates", "3", "--teacher-steps", "11", "--aux", "0.25", "--cache", "/tmp/c"],
    ["route", "--quick", "--baselines", "none", "--independent", "none"], ["route", "--loss", "nope"],
    ["route", "--hops", "2,x"],
]


def resolve(argv: list[str]) -> dict:
    """``{"config": asdict(resolved config)}`` or ``{"error": message}`` for one command line."""
    from masklab import cli
    try:
        from masklab.util.errors import MasklabError
    except ImportError:  # before masklab/util/errors.py existed
        from masklab.lab.runner import MasklabError

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = cli.build_parser().parse_args(cli._unalias(argv) if hasattr(cli, "_unalias") else argv)
        cfg = cli.resolve_config(args) if hasattr(cli, "resolve_config") else _old_resolve(cli, args)
    except SystemExit as e:
        return {"error": f"exit {e.code}: " + err.getvalue().strip().splitlines()[-1]}
    except MasklabError as e:
        return {"error": f"masklab: error: {e}"}
    return {"config": json.loads(json.dumps(dataclasses.asdict(cfg)))}


def _old_resolve(cli, args):
    import importlib

    mod = importlib.import_module(args.study)
    return cli._seeds(args, mod.config_from_args(args, mod.quick_config() if args.quick else mod.Config()))


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({" ".join(a): resolve(a) for a in CASES}, indent=1) + "\n")
