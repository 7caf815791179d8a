"""The ``masklab`` command.

Every study is a subcommand taking ``--out DIR``, ``--seeds N`` (or ``--seed S``),
``--quick``, ``--jobs``, ``--executor local|ray`` (with ``--ray-address``, see
docs/cluster.md), ``--device auto|cpu|cuda``, ``--precision fp32|bf16|fp16``
(:mod:`masklab.util.device`) and ``--no-progress`` (added here, once) and the flags declared on its
config dataclass (:mod:`masklab.util.flags`); ``masklab reproduce NAME`` runs a paper table on
its defaults, ``masklab sweep NAME`` a factor sweep, ``masklab report`` regenerates the
tables in README.md and docs/ from results files (:mod:`masklab.lab.doctables`). A study module provides ``NAME``,
``Config`` (a dataclass whose fields declare the flags), ``quick_config()``,
``reproduce_config()`` and ``run(cfg, out, jobs, progress, command)``.

The subcommand table is lazy: every command is declared here by name and help
(:data:`COMMANDS`, :data:`STUDIES`), and only the chosen one's parser is built, importing its
module, so ``masklab compress`` imports no study, no :mod:`masklab.lab` module and no torch
before its flags are parsed; ``masklab --help`` still lists every command with its help
(tests/test_cli_start.py checks the declared helps against the modules').
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import shlex
import sys
import tempfile
from pathlib import Path

from masklab.util import flags
from masklab.util.errors import MasklabError

# the commands for your own documents and models, in the order --help lists them: name -> (the
# module whose add_parser(sub) declares the parser, or None for one declared here; its help)
COMMANDS = {
    "compress": ("masklab.context.cli", "prune a document to what a question needs before a model reads it"),
    "train-router": (
        "masklab.lab.train_router",
        "train a router of each shipped kind (--kind evidence, pruner, pruner-ctx, pruner-passage) from the "
        "corpus or your documents",
    ),
    "serve": ("masklab.context.serve", "serve masklab compress over HTTP (JSON), the model loaded once"),
    "models": (None, "list the pretrained models masklab can load and whether they are installed"),
    "cite": ("masklab.pretrained.cli", "which sentences of a context a pretrained LM's answer causally depends on"),
    "realdocs": ("masklab.lab.realdocs", "measure routers on the frozen real-document benchmark"),
}
STUDIES = {
    "gotu": "masklab.lab.studies.gotu",
    "arith": "masklab.lab.studies.arith",
    "vision": "masklab.lab.studies.vision",
    "lm": "masklab.lab.studies.lm",
    "evidence": "masklab.lab.studies.evidence",
    "stale": "masklab.lab.studies.stale",
    "prune": "masklab.lab.studies.prune",
    "pretrained": "masklab.lab.studies.pretrained",
    "routing": "masklab.lab.studies.routing",
    "tune-prior": "masklab.lab.studies.tune_prior",
    "longctx": "masklab.lab.studies.longctx",
    "evidence-prior": "masklab.lab.studies.evidence_prior",
}
# each study's help: the first line of its module's docstring (declared here so that listing the
# commands imports no study; tests/test_cli_start.py checks them)
STUDY_HELP = {
    "gotu": "Study A, Boolean table: generalisation on the unseen (GOTU) with mask priors vs QK inits.",
    "arith": "Study A, arithmetic table: low-data addition and multiplication with digit-alignment mask priors.",
    "vision": "Study A, vision table: a 2-D locality mask prior vs default / mimetic / impulse inits in a ViT.",
    "lm": "Study A, language table: a causal relative-distance mask prior in a GPT-style LM.",
    "evidence": "Study B, first half: causal evidence sets vs attention, on gyms with exact gold evidence.",
    "stale": "Study B on real LMs: do pretrained models attend to the stale value even when right?",
    "prune": "Study B on real LMs: prune the context for the LM at a budget; evidence router vs kvpress.",
    "pretrained": "Study B on real pretrained LMs, all tables: stale attention, evidence vs ContextCite, pruning "
    "vs kvpress.",
    "routing": "Study B, second half: routers trained on causal evidence vs attention vs gold, sparse inference.",
    "tune-prior": "Tune attention priors alone on a frozen pretrained LM to fix stale answers (vs LoRA).",
    "longctx": "Long-context evidence routing on real LMs: RULER-style tasks, pruning before prefill.",
    "evidence-prior": "Priors without an oracle: derive the mask from causal interventions, then train with it.",
}
# the commands that follow the studies, declared here
TOOLS = {
    "reproduce": "run the study that reproduces a paper table, on its defaults",
    "sweep": "run a factor sweep (which conditions make a claim hold)",
    "report": "regenerate the tables and numbers in README.md and docs/ from the results files they name",
}
# commands of real LMs that are not studies: they take --device/--precision and resolve them themselves
REAL_LM_COMMANDS = ("cite", "compress", "train-router", "serve", "realdocs")
# old command names that still work (not listed in --help)
ALIASES = {"route": "routing"}
SWEEPS = {
    "gotu-designs": "masklab.lab.studies.gotu_designs",
    "routing-targets": "masklab.lab.studies.routing_targets",
    "arith-size": "masklab.lab.studies.arith_size",
}
# masklab.util.device.PRECISIONS, which imports torch: named here so that a parser imports no
# torch (tests/test_cli_start.py checks that they agree)
PRECISIONS = ("fp32", "bf16", "fp16")


def _quick_help(mod) -> str:
    """``--quick``'s help: the first sentence of the study's ``quick_config`` docstring (its
    measured size and time), else a generic line."""
    doc = (getattr(getattr(mod, "quick_config", None), "__doc__", None) or "").strip()
    first = " ".join(doc.split("\n\n")[0].split()).rstrip(".").replace("%", "%%")
    return (
        f"small version (smoke test): {first[0].lower() + first[1:]}"
        if first
        else "small version (smoke test) that finishes in a minute or two"
    )


def _common(
    ap: argparse.ArgumentParser,
    default_out: str,
    seeds_default: str = "the study's seeds",
    quick_help: str = "small version (smoke test) that finishes in a minute or two",
) -> None:
    from masklab.lab import executors

    ap.add_argument(
        "--out", default=default_out, metavar="DIR", help=f"output directory (default {default_out or 'runs/NAME'})"
    )
    seeds = ap.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, metavar="N", help=f"run seeds 0..N-1 (default {seeds_default})")
    seeds.add_argument("--seed", type=int, metavar="S", help="run this one seed")
    ap.add_argument("--quick", action="store_true", help=quick_help)
    jobs = min(os.cpu_count() or 1, 4)
    ap.add_argument(
        "--jobs",
        type=int,
        default=jobs,
        metavar="N",
        help=f"runs in parallel, one torch thread each (default {jobs}: the CPUs, at most 4)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument(
        "--keep-old-runs",
        action="store_true",
        help="keep finished runs in --out that other code made; results.md then warns that the table mixes code "
        "(default off: they are run again)",
    )
    ap.add_argument(
        "--executor",
        choices=executors.EXECUTORS,
        default="local",
        help="where runs execute: local (this machine, --jobs at a time) or ray (one Ray task per run; "
        "docs/cluster.md) (default local)",
    )
    ap.add_argument(
        "--ray-address",
        metavar="ADDR",
        default=None,
        help="Ray cluster to use with --executor ray: HOST:PORT, or auto to join the running cluster (default the "
        "running local one, else a new one on this machine)",
    )
    device_flags(ap)


def device_flags(ap: argparse.ArgumentParser) -> None:
    """``--device`` and ``--precision``: every study and every real-LM command takes them."""
    ap.add_argument(
        "--device",
        default="auto",
        metavar="DEVICE",
        help="where models compute: auto (CUDA when available, else the CPU), cpu, cuda or cuda:N (default auto)",
    )
    ap.add_argument(
        "--precision",
        default="fp32",
        choices=PRECISIONS,
        help="fp32, or autocast to bf16 / fp16 (fp16 training uses a loss scaler on CUDA) (default fp32)",
    )


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors (a bad number, a missing value, an unknown choice) as one
    ``masklab: error: ...`` line naming the command's ``--help``, exit 2, like every other
    bad input (subcommands' parsers are of this class too)."""

    def error(self, message: str):
        self.exit(2, f"masklab: error: {message} (see `{self.prog} --help`)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``masklab`` parser. ``only``: the command whose parser is built in full (its module
    imported); every other command is listed by its name and help alone, so parsing one
    command imports nothing another needs. None: every command built in full."""
    ap = Parser(
        prog="masklab",
        description="Structure in transformer attention: mask priors and causal evidence "
        "routing. The commands for your own documents and models come first (compress, train-router, "
        "serve, models, cite, realdocs); the research studies, reproduce, sweep and report follow.",
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {**{n: h for n, (_, h) in COMMANDS.items()}, **STUDY_HELP, **TOOLS}
    for name, help in helps.items():
        if only is None or name == only:
            _add_full(sub, name)
        else:
            sub.add_parser(name, help=help)
    return ap


def _add_full(sub, name: str) -> None:
    """Command ``name``'s parser with all its flags (what ``masklab NAME`` parses with)."""
    if name == "models":
        mp = sub.add_parser(name, help=COMMANDS[name][1])
        mp.add_argument("--load", metavar="NAME", help="load (and cache) this model now and report the load time")
        device_flags(mp)  # for --load
    elif name == "cite":
        from masklab.pretrained import cli as pretrained_cli

        pretrained_cli.add_cite_parser(sub)
    elif name in COMMANDS:
        importlib.import_module(COMMANDS[name][0]).add_parser(sub)
    elif name in STUDIES:
        mod = importlib.import_module(STUDIES[name])
        p = sub.add_parser(name, help=STUDY_HELP[name])
        _common(p, f"runs/{name}", ",".join(map(str, mod.Config().seeds)), _quick_help(mod))
        flags.add_flags(p, mod.Config)
        p.set_defaults(study=STUDIES[name])
    elif name in ("reproduce", "sweep"):
        p = sub.add_parser(name, help=TOOLS[name])
        p.add_argument("name", choices=sorted(STUDIES if name == "reproduce" else SWEEPS))
        _common(p, "")
    else:
        rp = sub.add_parser(name, help=TOOLS[name])
        rp.add_argument(
            "--check",
            action="store_true",
            help="only compare: list the files whose generated blocks differ and exit 1 if any do",
        )
        rp.add_argument(
            "--stale",
            action="store_true",
            help="only list the results files holding runs made by code other than this checkout's, comments, "
            "docstrings and formatting aside (stale), or by code that cannot be told (unknown), and why; exit 1 "
            "if any: run before a release",
        )
        rp.add_argument(
            "--root",
            default=".",
            metavar="DIR",
            help="the repository root holding README.md, docs/ and results/ (default .)",
        )
    if name in REAL_LM_COMMANDS:  # the studies, reproduce and sweep have them from _common
        device_flags(sub.choices[name])


def report(args: argparse.Namespace) -> int:
    from masklab.lab import doctables

    root = Path(args.root)
    if not (root / "README.md").is_file():
        raise MasklabError(f"{root} holds no README.md: give the repository root with --root")
    if args.stale:
        listed = doctables.stale_results(root)
        for path, state, whys in listed:
            why = "; ".join(f"{n} runs by {w}" if w.startswith("code ") else w for w, n in whys.items())
            print(f"{state}: {path} ({why})")
        n, stale = len(doctables.results_paths(root)), sum(state == "stale" for _, state, _ in listed)
        print(
            f"{n - len(listed)} of {n} results files were made by this checkout's code (comments, docstrings and "
            f"formatting aside); {stale} stale, {len(listed) - stale} unknown",
            file=sys.stderr,
        )
        return 1 if listed else 0
    changed = doctables.update(root, check=args.check)
    for path in changed:
        print(f"{'differs' if args.check else 'rewrote'}: {path}")
    if args.check and changed:
        print(
            "masklab: the generated blocks above differ from their results files; run `masklab report`", file=sys.stderr
        )
        return 1
    return 0


def _seeds(args: argparse.Namespace, cfg):
    if args.seeds is not None:
        if args.seeds < 1:
            raise MasklabError("--seeds must be at least 1")
        return dataclasses.replace(cfg, seeds=list(range(args.seeds)))
    if args.seed is not None:
        return dataclasses.replace(cfg, seeds=[args.seed])
    return cfg


def resolve_config(args: argparse.Namespace):
    """The config a study subcommand runs: its quick or default config, the flags given
    applied (:func:`masklab.util.flags.config_from_args`), then ``--seeds``/``--seed``."""
    mod = importlib.import_module(args.study)
    return _seeds(args, flags.config_from_args(args, mod.quick_config() if args.quick else mod.Config()))


def _unalias(argv: list[str]) -> list[str]:
    """``route ...`` -> ``routing ...`` (also after ``reproduce``)."""
    argv = list(argv)
    for i in (0, 1):
        if len(argv) > i and argv[i] in ALIASES and (i == 0 or argv[0] == "reproduce"):
            argv[i] = ALIASES[argv[i]]
    return argv


def writable_dir(out: Path) -> None:
    """Fail with one clear message, before any run starts, when ``--out`` cannot be created
    or written. Nothing is left behind here: the runner creates ``--out`` when the first run
    starts, so a command refused by validation leaves no empty directory behind.

    Permission bits are not enough (root passes ``os.access`` on ``/proc`` or a read-only
    mount): a folder is really made, and removed, in ``--out`` or its nearest existing parent."""
    if out.exists() and not out.is_dir():
        raise MasklabError(f"cannot create the output directory {out}: Not a directory")
    parent = out.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise MasklabError(f"cannot create the output directory {out}: Not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".masklab-probe-", dir=parent))
    except OSError as e:
        if parent == out.absolute():
            raise MasklabError(f"the output directory {out} is not writable ({e.strerror or e})") from None
        raise MasklabError(
            f"cannot create the output directory {out}: {parent} takes no new folders ({e.strerror or e})"
        ) from None


def validate(mod, cfg, args: argparse.Namespace) -> None:
    """The one validation step of every study command, before any run or model load: the
    ranges declared on the config's flags (:func:`masklab.util.flags.check_ranges`), the study's
    own ``validate(cfg)`` (choices, files, combinations), ``--jobs`` and ``--out``."""
    if dataclasses.is_dataclass(cfg):
        flags.check_ranges(cfg)
    models = getattr(cfg, "models", None)
    if isinstance(models, list) and all(isinstance(m, str) for m in models):
        from masklab.text.inputs import check_model_paths

        check_model_paths(models)
    if hasattr(mod, "validate"):
        mod.validate(cfg)
    if args.jobs < 1:
        raise MasklabError("--jobs must be at least 1")


def smoke_test_note(mod, cfg, results: dict) -> str:
    """The line a ``--quick`` results.md opens with: a smoke test, its n, and the sizes that
    differ from the study's defaults."""
    ns = sorted({r.get("n") for r in results.get("summary", []) if isinstance(r.get("n"), int)})
    n = "n = " + ("-".join(map(str, (ns[0], ns[-1]))) if len(ns) > 1 and ns[0] != ns[-1] else str(ns[0] if ns else 0))
    smaller = []
    try:
        full = mod.Config()
        for f in dataclasses.fields(cfg):
            a, b = getattr(cfg, f.name), getattr(full, f.name)
            if isinstance(a, (int, float)) and not isinstance(a, bool) and isinstance(b, (int, float)) and a != b:
                smaller.append(f"{f.name} {a} (default {b})")
    except Exception:  # noqa: BLE001 (a study without a default Config: the note just has no sizes)
        smaller = []
    sizes = f"; sizes that differ from the defaults: {', '.join(smaller)}" if smaller else ""
    return (
        f"> **Smoke test** (`--quick`): checks that the study runs, not what it finds; {n} run(s) per row{sizes}. "
        "Run without `--quick` for the numbers the docs quote.\n\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = "masklab " + shlex.join(argv)
    argv = _unalias(argv)
    try:
        args = build_parser(argv[0] if argv else "").parse_args(argv)  # imports the chosen command's module only
    except KeyboardInterrupt:
        print("masklab: interrupted", file=sys.stderr)
        return 130
    try:
        if args.command in ("models", "cite"):
            from masklab.pretrained import cli as pretrained_cli

            return pretrained_cli.main(args)
        if args.command == "report":
            return report(args)
        if getattr(args, "handler", None) is not None:
            args.command_line = command  # the command as typed, for the files it writes
            return args.handler(args)
        run_study(args, command)
    except MasklabError as e:
        print(f"masklab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command not in ("reproduce", "sweep") and not hasattr(args, "study"):  # no runs to resume
            print("masklab: interrupted", file=sys.stderr)
        else:
            print("masklab: interrupted; finished runs are kept, run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        _reset()
    return 0


def run_study(args: argparse.Namespace, command: str) -> None:
    """A study, ``reproduce`` or ``sweep``: validated, run, its results.md printed."""
    from masklab.lab import distributed, executors, runner
    from masklab.util import device as devices
    from masklab.util.files import atomic_write_text, read_json, write_json

    # the runs' device and precision, before torchrun's process group (nccl on CUDA);
    # one clear error for --device cuda without a GPU, before anything is written
    devices.use(args.device, args.precision)
    distributed.init_from_env()  # under torchrun: join the process group (gloo on CPU)
    if args.command in ("reproduce", "sweep"):
        module = STUDIES[args.name] if args.command == "reproduce" else SWEEPS[args.name]
        mod = importlib.import_module(module)
        cfg = _seeds(args, mod.quick_config() if args.quick else mod.reproduce_config())
        out = Path(args.out or f"runs/{args.name}")
    else:
        mod = importlib.import_module(args.study)
        cfg = resolve_config(args)
        out = Path(args.out)
    validate(mod, cfg, args)
    writable_dir(out)
    executors.use(args.executor, args.ray_address)
    runner.KEEP_OLD_RUNS = args.keep_old_runs
    mod.run(cfg, out, jobs=args.jobs, progress=not args.no_progress, command=command)
    if distributed.is_main():
        results = {**read_json(out / "results.json"), "command": command}
        write_json(out / "results.json", results)
        if args.quick and (out / "results.md").exists():
            atomic_write_text(out / "results.md", smoke_test_note(mod, cfg, results) + (out / "results.md").read_text())
        print((out / "results.md").read_text())
        print(f"results: {out / 'results.json'}")


def _reset() -> None:
    """The choices last one command (main() may be called again in-process): what a study set
    goes back to its default; a module the command never imported still holds its own."""
    if "masklab.lab.executors" in sys.modules:
        sys.modules["masklab.lab.executors"].use("local")
    if "masklab.util.device" in sys.modules:
        sys.modules["masklab.util.device"].use("cpu")
    if "masklab.lab.runner" in sys.modules:
        sys.modules["masklab.lab.runner"].KEEP_OLD_RUNS = False
    if "masklab.lab.distributed" in sys.modules:
        sys.modules["masklab.lab.distributed"].shutdown()
