"""Study B on real pretrained LMs, all tables: stale attention, evidence vs ContextCite, pruning vs kvpress.

``masklab reproduce pretrained`` runs three sub-studies into ``OUT/stale``, ``OUT/cite``
and ``OUT/prune`` (each with its own results.json / results.md; a killed run resumes per
model) and writes ``OUT/results.json`` + ``OUT/results.md`` joining them. Budget: about
45 minutes on an idle 2-core CPU with ``--jobs 2`` (one model per worker); ``--quick``
runs a few minutes.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from masklab.runner import atomic_write_text, environment, write_json
from masklab.studies import cite_compare, prune, stale

NAME = "pretrained"


@dataclass
class Config:
    stale: stale.Config = field(default_factory=stale.Config)
    cite: cite_compare.Config = field(default_factory=cite_compare.Config)
    prune: prune.Config = field(default_factory=lambda: replace(prune.Config(), models=["gemma3-270m", "smollm2-135m"],
                                                               train_prompts=30, test_prompts=30))
    seeds: list[int] = field(default_factory=lambda: [0])


def quick_config() -> Config:
    return Config(stale=replace(stale.quick_config(), prompts=10),
                  cite=replace(cite_compare.quick_config(), models=["smollm2-135m"]),
                  prune=replace(prune.quick_config(), models=["smollm2-135m"]))


def reproduce_config() -> Config:
    return Config()


def run(cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab reproduce pretrained") -> dict:
    out = Path(out)
    parts = {}
    for name, mod, sub in (("stale", stale, cfg.stale), ("cite", cite_compare, cfg.cite), ("prune", prune, cfg.prune)):
        sub = replace(sub, seeds=cfg.seeds)
        parts[name] = mod.run(sub, out / name, jobs=jobs, progress=progress, command=f"{command}  (part: {name})")
    results = {"study": NAME, "config": asdict(cfg),
               "runs": [dict(r, part=n) for n, res in parts.items() for r in res["runs"]],
               "summary": [dict(s, part=n) for n, res in parts.items() for s in res["summary"]],
               "paper": [dict(p, part=n) for n, res in parts.items() for p in res["paper"]],
               "environment": environment()}
    write_json(out / "results.json", results)
    md = [f"# {NAME}", "", f"Regenerate with: `{command}`", ""]
    for name in parts:
        text = (out / name / "results.md").read_text().split("\n", 1)[1]
        text = text.replace("](stale_heads.png)", f"]({name}/stale_heads.png)")
        md += [f"## {name}", text.strip(), ""]
    atomic_write_text(out / "results.md", "\n".join(md) + "\n")
    return results


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", help="comma-separated models for all three parts (default gemma3-270m,smollm2-135m)")
    ap.add_argument("--stale-prompts", type=int, help="prompts per model in the stale attention part (default 200)")
    ap.add_argument("--cite-prompts", type=int, help="prompts per model in the evidence vs ContextCite part (default 10)")
    ap.add_argument("--train-prompts", type=int, help="router training prompts per model in the pruning part (default 30)")
    ap.add_argument("--test-prompts", type=int, help="test prompts per model in the pruning part (default 30)")
    ap.add_argument("--prompt-format", choices=["raw", "chat"], help="raw completion or chat turns, all parts (default: each model's own)")


def config_from_args(args: argparse.Namespace, base: Config) -> Config:
    from masklab.cli import str_list

    cfg = base
    if args.models:
        ms = str_list(args.models)
        cfg = replace(cfg, stale=replace(cfg.stale, models=ms), cite=replace(cfg.cite, models=ms),
                      prune=replace(cfg.prune, models=ms))
    if args.stale_prompts:
        cfg = replace(cfg, stale=replace(cfg.stale, prompts=args.stale_prompts))
    if args.cite_prompts:
        cfg = replace(cfg, cite=replace(cfg.cite, prompts=args.cite_prompts))
    if args.train_prompts:
        cfg = replace(cfg, prune=replace(cfg.prune, train_prompts=args.train_prompts))
    if args.test_prompts:
        cfg = replace(cfg, prune=replace(cfg.prune, test_prompts=args.test_prompts))
    if args.prompt_format:
        fmt = args.prompt_format
        cfg = replace(cfg, stale=replace(cfg.stale, prompt_format=fmt), cite=replace(cfg.cite, prompt_format=fmt),
                      prune=replace(cfg.prune, prompt_format=fmt))
    return cfg
