"""The ``masklab`` command.

Every study is a subcommand taking ``--out DIR``, ``--seeds N`` (or ``--seed S``),
``--quick``, ``--jobs`` and ``--executor local|ray`` (with ``--ray-address``, see
docs/cluster.md); ``masklab reproduce NAME`` runs a paper table on its defaults,
``masklab sweep NAME`` a factor sweep. A study module provides ``NAME``,
``add_arguments(parser)``, ``config_from_args(args, base)``, ``quick_config()``,
``reproduce_config()`` and ``run(cfg, out, jobs, progress, command)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import shlex
import sys
from pathlib import Path

from masklab import distributed, executors
from masklab.executors import EXECUTORS
from masklab.runner import MasklabError

STUDIES = {
    "gotu": "masklab.studies.gotu",
    "arith": "masklab.studies.arith",
    "vision": "masklab.studies.vision",
    "lm": "masklab.studies.lm",
    "evidence": "masklab.studies.evidence",
    "stale": "masklab.studies.stale",
    "prune": "masklab.studies.prune",
    "pretrained": "masklab.studies.pretrained",
    "route": "masklab.studies.routing",
}
# `masklab reproduce NAME` also accepts the names of the paper tables
REPRODUCE = {**{name: name for name in STUDIES}, "routing": "route"}
SWEEPS = {"gotu-designs": "masklab.studies.gotu_designs", "routing-targets": "masklab.studies.routing_targets"}


def str_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in str_list(text)]
    except ValueError:
        raise MasklabError(f"expected comma-separated integers, got {text!r}") from None


def _common(ap: argparse.ArgumentParser, default_out: str) -> None:
    ap.add_argument("--out", default=default_out, help=f"output directory (default {default_out or 'runs/NAME'})")
    seeds = ap.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, help="run seeds 0..N-1")
    seeds.add_argument("--seed", type=int, help="run this one seed")
    ap.add_argument("--quick", action="store_true", help="small version that finishes in a minute or two")
    ap.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 4), help="runs in parallel (one torch thread each)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--executor", choices=EXECUTORS, default="local",
                    help="where runs execute: local (this machine, --jobs at a time) or ray (one Ray task per run; docs/cluster.md)")
    ap.add_argument("--ray-address", metavar="ADDR", default=None,
                    help="Ray cluster to use with --executor ray: HOST:PORT, or auto to join the running cluster (default: the running local one, else start one)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="masklab", description="Structure in transformer attention: mask priors and causal evidence routing.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in STUDIES.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        _common(p, f"runs/{name}")
        mod.add_arguments(p)
        p.set_defaults(study=module)
    rep = sub.add_parser("reproduce", help="run the study that reproduces a paper table, on its defaults")
    rep.add_argument("name", choices=sorted(REPRODUCE))
    _common(rep, "")
    mp = sub.add_parser("models", help="list the pretrained models masklab can load and whether they are installed")
    mp.add_argument("--load", metavar="NAME", help="load (and cache) this model now and report the load time")
    from masklab.pretrained import cli as pretrained_cli

    pretrained_cli.add_cite_parser(sub)
    sw = sub.add_parser("sweep", help="run a factor sweep (which conditions make a claim hold)")
    sw.add_argument("name", choices=sorted(SWEEPS))
    _common(sw, "")
    return ap


def _seeds(args: argparse.Namespace, cfg):
    if args.seeds is not None:
        if args.seeds < 1:
            raise MasklabError("--seeds must be at least 1")
        return dataclasses.replace(cfg, seeds=list(range(args.seeds)))
    if args.seed is not None:
        return dataclasses.replace(cfg, seeds=[args.seed])
    return cfg


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = "masklab " + shlex.join(argv)
    try:
        if args.command in ("models", "cite"):
            from masklab.pretrained import cli as pretrained_cli

            return pretrained_cli.main(args)
        distributed.init_from_env()  # under torchrun: join the process group (gloo on CPU)
        if args.command in ("reproduce", "sweep"):
            module = STUDIES[REPRODUCE[args.name]] if args.command == "reproduce" else SWEEPS[args.name]
            mod = importlib.import_module(module)
            cfg = mod.quick_config() if args.quick else mod.reproduce_config()
            out = Path(args.out or f"runs/{args.name}")
        else:
            mod = importlib.import_module(args.study)
            cfg = mod.config_from_args(args, mod.quick_config() if args.quick else mod.Config())
            out = Path(args.out)
        cfg = _seeds(args, cfg)
        if args.jobs < 1:
            raise MasklabError("--jobs must be at least 1")
        executors.use(args.executor, args.ray_address)
        mod.run(cfg, out, jobs=args.jobs, progress=not args.no_progress, command=command)
        if distributed.is_main():
            print((out / "results.md").read_text())
            print(f"results: {out / 'results.json'}")
    except MasklabError as e:
        print(f"masklab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("masklab: interrupted; finished runs are kept, run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        executors.use("local")  # the choice lasts one command (main() may be called again in-process)
        distributed.shutdown()
    return 0
