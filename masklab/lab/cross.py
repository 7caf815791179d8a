"""Training the cross-encoder pruner (:mod:`masklab.context.cross`, the ``cross`` router).

:func:`train` fine-tunes every weight of the encoder and the head (``full``, the default) or
only low-rank adapters (PEFT's LoRA) on the top ``TRAIN_LAYERS`` layers, with a binary
cross-entropy on each core unit (1: a target unit of the labels, 0: the rest), on windows
built exactly as in use. It checkpoints every ``checkpoint_steps`` steps (model, optimiser,
generator and the position in the epoch), stops cleanly after ``limit_seconds`` and resumes
from the last checkpoint in a later process: hours of CPU split across sessions. :func:`save`
writes one safetensors file (the whole encoder and head in float16, or the adapters and the
head) and a JSON file beside it.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from masklab.context.cross import CrossPruner, frozen
from masklab.util.errors import MasklabError


@dataclass
class Example:
    """One training question: its document's units and the target units (indices into them)."""

    question: str
    units: list[str]
    target: list[int]


@dataclass
class CrossConfig:
    epochs: int = 2
    full: bool = True  # every encoder weight (False: LoRA adapters on the top TRAIN_LAYERS layers)
    lr: float = 3e-5  # the encoder's weights (LoRA adapters: 3e-4)
    head_lr: float = 1e-3
    batch: int = 8  # windows per step
    pos_weight: float = 4.0  # about the ratio of other core units to target units
    negatives: float = 0.5  # chance that a question also trains on one window without a target
    checkpoint_steps: int = 50  # steps between checkpoints (a killed run loses at most these)
    seed: int = 0


def training_windows(model: CrossPruner, examples: list[Example], rng: random.Random, negatives: float):
    """``(window, labels (stop - start,))`` pairs: every window holding a target unit, and with
    chance ``negatives`` one window of the same document without one."""
    out = []
    for e in examples:
        wins = model.windows(e.question, e.units)
        target = set(e.target)
        pos = [w for w in wins if target & set(range(w.start, w.stop))]
        neg = [w for w in wins if not target & set(range(w.start, w.stop))]
        picked = pos + ([rng.choice(neg)] if neg and rng.random() < negatives else [])
        for w in picked:
            out.append((w, torch.tensor([float(i in target) for i in range(w.start, w.stop)])))
    return out


def train(
    examples: list[Example],
    cfg: CrossConfig,
    checkpoint: Path | None = None,
    progress: bool = True,
    limit_seconds: float | None = None,
) -> tuple[CrossPruner, dict]:
    """Fit a :class:`CrossPruner` on ``examples`` (module docstring). ``checkpoint``: a folder
    where the run is saved every ``cfg.checkpoint_steps`` steps and at each epoch's end; a run
    given the same folder continues from there. ``limit_seconds``: save and stop after the
    step that passes this much time (``record["done"]`` is then False). Returns the model and
    a record (loss per epoch, steps, seconds, done)."""
    from masklab.lab.runner import Checkpoint

    usable = [e for e in examples if e.target]
    if not usable:
        raise MasklabError("no training question has a target unit: nothing to learn from")
    torch.manual_seed(cfg.seed)
    model = CrossPruner()
    if not cfg.full:
        model.add_adapters()
    trainable = model.trainable(cfg.full)
    for n, p in model.named_parameters():
        p.requires_grad_(n in trainable)
    head = [p for n, p in trainable.items() if n.startswith("head.")]
    body = [p for n, p in trainable.items() if not n.startswith("head.")]
    opt = torch.optim.AdamW([{"params": body, "lr": cfg.lr}, {"params": head, "lr": cfg.head_lr}], weight_decay=0.01)
    gen = torch.Generator().manual_seed(cfg.seed)
    ckpt = Checkpoint(checkpoint) if checkpoint is not None else None
    data = hashlib.sha256(json.dumps([[e.question, e.target, len(e.units)] for e in usable]).encode()).hexdigest()[:12]
    record = {
        "loss": [],
        "seconds": 0.0,
        "windows": 0,
        "epoch": 0,
        "batch": 0,
        "done": False,
        "config": asdict(cfg),
        "data": data,
        "questions": len(usable),
    }
    if ckpt is not None and ckpt.exists:
        from masklab.util.files import read_json

        saved = read_json(Path(checkpoint) / "ckpt.json")["extra"]
        if saved.get("config") != asdict(cfg) or saved.get("data") != data:
            raise MasklabError(
                f"the checkpoint in {checkpoint} was made with other settings or data: remove it or give the same"
            )
        _, record = ckpt.load(model, opt, gen)
    model.train(False)  # no dropout: the same scores in training and use
    lossf = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(cfg.pos_weight), reduction="sum")
    t_start = time.perf_counter()
    while record["epoch"] < cfg.epochs:
        ep = record["epoch"]
        rng = random.Random(cfg.seed * 1000 + ep)
        pairs = training_windows(model, usable, rng, cfg.negatives)
        rng.shuffle(pairs)
        starts = list(range(0, len(pairs), cfg.batch))
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(
                total=len(starts),
                initial=record["batch"],
                desc=f"cross pruner epoch {ep + 1}/{cfg.epochs}",
                unit="step",
                file=sys.stderr,
            )
        sums = record.setdefault("epoch_loss", [0.0, 0])
        t0 = time.perf_counter()
        for k in range(record["batch"], len(starts)):
            chunk = pairs[starts[k] : starts[k] + cfg.batch]
            opt.zero_grad()
            logits = model.window_logits([w for w, _ in chunk], batch=cfg.batch)
            loss = lossf(torch.cat(logits), torch.cat([y for _, y in chunk])) / len(chunk)
            loss.backward()
            opt.step()
            sums[0], sums[1] = sums[0] + float(loss.detach()) * len(chunk), sums[1] + len(chunk)
            record["batch"], record["steps"] = k + 1, record.get("steps", 0) + 1
            if bar is not None:
                bar.update()
            over = limit_seconds is not None and time.perf_counter() - t_start > limit_seconds
            if ckpt is not None and (over or record["batch"] % cfg.checkpoint_steps == 0):
                record["seconds"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                ckpt.save(record["steps"], model, opt, gen, record)
            if over:
                if bar is not None:
                    bar.close()
                return frozen(model), record
        if bar is not None:
            bar.close()
        record["loss"].append(sums[0] / max(1, sums[1]))
        record.update(windows=sums[1], epoch=ep + 1, batch=0, epoch_loss=[0.0, 0])
        record["seconds"] += time.perf_counter() - t0
        if ckpt is not None:
            ckpt.save(record.get("steps", 0), model, opt, gen, record)
    record["done"] = True
    return frozen(model), record  # adapters not merged: save() stores them; load_cross() merges


def save(model: CrossPruner, path: Path, meta: dict) -> None:
    """``path`` (``.safetensors``: the whole encoder and head in float16 for a ``full`` model,
    else the adapters and the head) and ``path.with_suffix(".json")``."""
    from safetensors.torch import save_file

    full = not hasattr(model, "adapters")
    state = (
        {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
        if full
        else {k: v.detach().contiguous() for k, v in model.trainable().items()}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))
    path.with_suffix(".json").write_text(
        json.dumps(
            {"design": "cross-full" if full else "cross", "max_tokens": model.max_tokens, "carry": model.carry, **meta},
            indent=1,
        )
        + "\n"
    )
