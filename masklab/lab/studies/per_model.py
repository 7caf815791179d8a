"""What the studies of real pretrained LMs (stale, cite, prune) share: one run per
(model, seed), the model in :attr:`RunSpec.model`, the same checks before anything loads."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from masklab.util.flags import flag
from masklab.lab.runner import RunSpec, run_study


def prompt_format_flag() -> Any:
    """The ``--prompt-format`` field of a study of real LMs (None: each model's own format)."""
    return flag(
        None,
        choices=["raw", "chat"],
        default_text="each model's own, see `masklab models`",
        help="raw completion or the model's chat turns",
    )


def model_specs(cfg: Any, task: str, method: str) -> list[RunSpec]:
    """One spec per (model, seed) of ``cfg`` (a config with ``models`` and ``seeds``); every
    other field of ``cfg`` goes into ``params``."""
    params = {k: v for k, v in asdict(cfg).items() if k not in ("models", "seeds")}
    return [RunSpec(task, method, s, params, model=m) for m in cfg.models for s in cfg.seeds]


def run_per_model(
    name: str,
    cfg: Any,
    specs: list[RunSpec],
    fn_path: str,
    out: Path,
    jobs: int,
    progress: bool,
    paper: list[dict] | None = None,
) -> dict:
    """Check the models and the prompt format (one clear error, before any download), then
    :func:`masklab.lab.runner.run_study` with at most one worker per run."""
    from masklab.pretrained.models import check_models, check_prompt_format

    check_models(cfg.models)
    check_prompt_format(cfg.prompt_format)
    return run_study(
        name,
        asdict(cfg),
        specs,
        fn_path,
        out,
        jobs=min(jobs, len(specs)),
        threads=cfg.threads,
        paper=paper,
        progress=progress,
    )


def load_model(spec: dict, attn: str = "sdpa"):
    """The spec's model (:func:`masklab.pretrained.models.load`) with its threads and prompt
    format, on the run's device (:func:`masklab.util.device.current`: the CLI's ``--device``)."""
    from masklab.util import device as devices
    from masklab.pretrained.models import load

    p = spec["params"]
    return load(
        spec["model"], attn=attn, threads=p["threads"], prompt_format=p.get("prompt_format"), device=devices.current()
    )
