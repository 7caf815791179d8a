"""Study B on real pretrained LMs, all tables: stale attention, evidence vs ContextCite, pruning vs kvpress.

``masklab reproduce pretrained`` runs three sub-studies into ``OUT/stale``, ``OUT/cite``
and ``OUT/prune`` (each with its own results.json / results.md; a killed run resumes per
model) and writes ``OUT/results.json`` + ``OUT/results.md`` joining them. Budget: about
45 minutes on an idle 2-core CPU with ``--jobs 2`` (one model per worker); ``--quick``
runs a few minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from pathlib import Path

from masklab.util.flags import Flag, flag, str_list
from masklab.util.files import atomic_write_text, write_json
from masklab.lab.runner import environment
from masklab.lab.studies import cite_compare, prune, stale

NAME = "pretrained"


PARTS = ("stale", "cite", "prune")


def set_in(parts: tuple[str, ...], name: str) -> Callable[[Any, Any, dict], dict]:
    """``apply`` of a flag that sets field ``name`` of the sub-configs ``parts``."""
    return lambda v, base, up: {p: replace(up.get(p, getattr(base, p)), **{name: v}) for p in parts}


@dataclass
class Config:
    stale: stale.Config = flag(
        factory=stale.Config,
        name="--models",
        parse=str_list,
        apply=set_in(PARTS, "models"),
        metavar="A,...",
        default_text="gemma3-270m,smollm2-135m",
        help="comma-separated models for all three parts",
        more=[
            Flag(
                "prompts per model in the stale attention part",
                name="--stale-prompts",
                parse=int,
                metavar="N",
                apply=set_in(("stale",), "prompts"),
                default_text="200",
            ),
            Flag(
                "raw completion or the model's chat turns, all three parts",
                name="--prompt-format",
                parse=str,
                choices=["raw", "chat"],
                apply=set_in(PARTS, "prompt_format"),
                default_text="each model's own",
            ),
        ],
    )
    cite: cite_compare.Config = flag(
        factory=cite_compare.Config,
        name="--cite-prompts",
        parse=int,
        metavar="N",
        apply=set_in(("cite",), "prompts"),
        default_text="10",
        help="prompts per model in the evidence vs ContextCite part",
    )
    prune: prune.Config = flag(
        factory=lambda: replace(
            prune.Config(), models=["gemma3-270m", "smollm2-135m"], train_prompts=30, test_prompts=30
        ),
        name="--train-prompts",
        parse=int,
        metavar="N",
        apply=set_in(("prune",), "train_prompts"),
        default_text="30",
        help="router training prompts per model in the pruning part",
        more=[
            Flag(
                "test prompts per model in the pruning part",
                name="--test-prompts",
                parse=int,
                metavar="N",
                apply=set_in(("prune",), "test_prompts"),
                default_text="30",
            )
        ],
    )
    seeds: list[int] = field(default_factory=lambda: [0])


def quick_config() -> Config:
    return Config(
        stale=replace(stale.quick_config(), prompts=10),
        cite=replace(cite_compare.quick_config(), models=["smollm2-135m"]),
        prune=replace(prune.quick_config(), models=["smollm2-135m"]),
    )


def reproduce_config() -> Config:
    return Config()


def run(
    cfg: Config, out: Path, jobs: int = 1, progress: bool = True, command: str = "masklab reproduce pretrained"
) -> dict:
    out = Path(out)
    parts = {}
    for name, mod, sub in (("stale", stale, cfg.stale), ("cite", cite_compare, cfg.cite), ("prune", prune, cfg.prune)):
        sub = replace(sub, seeds=cfg.seeds)
        parts[name] = mod.run(sub, out / name, jobs=jobs, progress=progress, command=f"{command}  (part: {name})")
    results = {
        "study": NAME,
        "config": asdict(cfg),
        "runs": [dict(r, part=n) for n, res in parts.items() for r in res["runs"]],
        "summary": [dict(s, part=n) for n, res in parts.items() for s in res["summary"]],
        "paper": [dict(p, part=n) for n, res in parts.items() for p in res["paper"]],
        "environment": environment(),
    }
    write_json(out / "results.json", results)
    md = [f"# {NAME}", "", f"Regenerate with: `{command}`", ""]
    for name in parts:
        text = (out / name / "results.md").read_text().split("\n", 1)[1]
        text = text.replace("](stale_heads.png)", f"]({name}/stale_heads.png)")
        md += [f"## {name}", text.strip(), ""]
    atomic_write_text(out / "results.md", "\n".join(md) + "\n")
    return results
