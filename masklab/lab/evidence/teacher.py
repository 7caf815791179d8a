"""Dense teachers for the evidence gyms: training with curricula, and a cache keyed by config.

A teacher is an :class:`~masklab.models.reader.EvidenceReader` trained with cross-entropy
on freshly generated examples every step (no fixed training set, so nothing to overfit):

* **length curriculum** - for the first ``base_frac`` of the steps contexts have
  ``[min_items, items]`` items; then the longest length grows linearly to
  ``max_factor * items`` by ``ramp_end`` of the steps, and stays there (lengths drawn
  uniformly from ``[min_items, current max]``), so the teacher reads up to 4x the base N;
* **hop curriculum** (multihop) - the largest number of hops grows from 1 to ``hops``
  over the first ``hop_frac`` of the steps; afterwards half of the examples have the
  full ``hops`` and half a random number in ``1..hops``;
* optional **auxiliary loss** (``aux > 0``, multihop only): block ``l`` must predict, from
  the query token through the answer head, the node reached after ``l + 1`` hops. Off by
  default, because it shapes the attention that the evidence study measures.

:func:`load_or_train` caches teachers as ``<cache>/teachers/<task>-<hash>.safetensors`` plus
a ``.json`` with the config and the held-out accuracies at ``items`` and at
``max_factor * items``; the hash covers every field of :class:`TeacherConfig`.

Teachers train and answer on the run's device (:func:`masklab.util.device.current`): examples
are drawn on the CPU from the step's seeded generator, then moved to it. A teacher trained
off the CPU is cached under its own key (``device``), so a CPU run never reads one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from masklab.util import device as devices
from masklab.models.reader import EvidenceReader
from masklab.lab.runner import Checkpoint, MasklabError, read_json, seed_everything, warmup_cosine, write_json
from masklab.lab.tasks.evidence_gyms import EvidenceBatch, Gym, make_gym

CACHE_VERSION = 1


@dataclass
class TeacherConfig:
    """Everything a teacher depends on (the cache key)."""

    task: str = "multihop"
    items: int = 16
    vocab: int = 256
    hops: int = 2
    updates: int = 2
    tags: int = 8
    max_count: int = 4
    max_factor: int = 4
    dim: int = 64
    depth: int = 4
    heads: int = 4
    steps: int = 3000
    batch: int = 64
    lr: float = 2e-3
    warmup: int = 100
    base_frac: float = 0.4
    ramp_end: float = 0.7
    hop_frac: float = 0.3
    aux: float = 0.0
    eval_examples: int = 1000
    seed: int = 0
    recency: bool = False  # reader option (see EvidenceReader); enters the key only when set
    device: str = (
        "cpu"  # the device type it is trained on (masklab.util.device.current().type); in the key only off the CPU
    )

    # options added later enter the cache key only when they differ from these values, so
    # teachers cached before they existed keep their keys
    _LATE_DEFAULTS = {"recency": False, "device": "cpu"}

    @property
    def max_items(self) -> int:
        return self.items * self.max_factor

    def key(self) -> str:
        fields = {
            k: v for k, v in asdict(self).items() if not (k in self._LATE_DEFAULTS and v == self._LATE_DEFAULTS[k])
        }
        raw = json.dumps({"v": CACHE_VERSION, **fields}, sort_keys=True)
        return f"{self.task}-{hashlib.sha1(raw.encode()).hexdigest()[:12]}"


def gym_of(cfg: TeacherConfig) -> Gym:
    return make_gym(cfg.task, cfg.vocab, cfg.hops, cfg.updates, cfg.tags, cfg.max_count)


def build_teacher(cfg: TeacherConfig) -> EvidenceReader:
    return EvidenceReader(cfg.vocab, cfg.max_items, cfg.dim, cfg.depth, cfg.heads, cfg.recency)


def schedule(cfg: TeacherConfig, step: int, gym: Gym) -> dict:
    """Curriculum at ``step``: item range and hop settings for :meth:`Gym.sample`."""
    frac = step / max(1, cfg.steps)
    lo = max(gym.min_items, min(cfg.items, max(2, cfg.items // 4)))
    if frac < cfg.base_frac or cfg.max_factor <= 1:
        hi = cfg.items
    else:
        ramp = min(1.0, (frac - cfg.base_frac) / max(1e-9, cfg.ramp_end - cfg.base_frac))
        hi = int(round(cfg.items + ramp * (cfg.max_items - cfg.items)))
    kw: dict = {}
    if cfg.task == "multihop":
        if frac < cfg.hop_frac:
            kw = {"max_hops": 1 + int(frac / cfg.hop_frac * cfg.hops), "p_full": 0.0}
        else:
            kw = {"max_hops": cfg.hops, "p_full": 0.5}
    return {"n_items": (lo, hi), **kw}


def hop_targets(batch: EvidenceBatch, layers: int) -> torch.Tensor:
    """``(B, layers)``: the node reached after ``min(l + 1, hops)`` hops (multihop)."""
    out = torch.zeros(len(batch), layers, dtype=torch.long)
    for b in range(len(batch)):
        n = int(batch.valid[b].sum())
        succ = {a: c for a, c in batch.items[b, :n].tolist()}
        node = int(batch.query[b, 0])
        for layer in range(layers):
            if layer < int(batch.hops[b]):
                node = succ[node]
            out[b, layer] = node
    return out


@torch.no_grad()
def accuracy(model: EvidenceReader, gym: Gym, n_items: int, examples: int, seed: int, chunk: int = 250) -> float:
    """Held-out accuracy on ``examples`` fresh examples with ``n_items`` items (full hops),
    drawn on the CPU and read on the model's device."""
    model.eval()
    rng = np.random.default_rng([seed, 7777, n_items])
    correct = 0
    for s in range(0, examples, chunk):
        b = gym.sample(min(chunk, examples - s), n_items, rng).to(devices.of(model))
        pred = model(b.items, b.query, b.valid, b.positions)[0].argmax(-1)
        correct += int((pred == b.answer).sum())
    return correct / examples


def train_teacher(cfg: TeacherConfig, ckpt_dir: Path | None = None, log=None) -> tuple[EvidenceReader, dict]:
    """Train a teacher from scratch (resuming from ``ckpt_dir`` if it holds a checkpoint) on
    the run's device. Returns ``(model, info)`` with held-out accuracies and the loss curve."""
    gym = gym_of(cfg)
    gym.check(cfg.max_items)
    seed_everything(cfg.seed)
    dev = devices.current()
    model = build_teacher(cfg).to(dev)  # before the optimiser: its state lives beside the parameters
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(cfg.seed)

    def lr_at(step: int) -> float:
        return warmup_cosine(step, cfg.steps, cfg.lr, cfg.warmup, floor=0.05)

    ckpt = Checkpoint(ckpt_dir) if ckpt_dir is not None else None
    step, curves = 0, {"step": [], "loss": [], "train_acc": []}
    if ckpt is not None and ckpt.exists:
        step, extra = ckpt.load(model, opt, gen)
        curves = extra["curves"]
    start = time.perf_counter()
    model.train()
    run_loss, run_acc, seen = 0.0, 0.0, 0
    log_every = max(1, cfg.steps // 20)
    while step < cfg.steps:
        rng = np.random.default_rng([cfg.seed, step])  # data of step s is fixed: resume-safe
        batch = gym.sample(cfg.batch, rng=rng, **schedule(cfg, step, gym))
        use_aux = cfg.aux > 0 and cfg.task == "multihop"
        targets = hop_targets(batch, cfg.depth).to(dev) if use_aux else None  # read from the CPU batch
        batch = batch.to(dev)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits, hidden = model(batch.items, batch.query, batch.valid, batch.positions, return_hidden=use_aux)
        loss = F.cross_entropy(logits, batch.answer)
        if use_aux:
            aux = sum(F.cross_entropy(model.answer_from(h), targets[:, layer]) for layer, h in enumerate(hidden))
            loss = loss + cfg.aux * aux / cfg.depth
        if not torch.isfinite(loss):
            raise MasklabError(f"teacher loss became {loss.item()} at step {step} ({cfg.task}); lower the teacher lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        run_loss += loss.item()
        run_acc += (logits.argmax(-1) == batch.answer).float().mean().item()
        seen += 1
        if step % log_every == 0 or step == cfg.steps:
            curves["step"].append(step)
            curves["loss"].append(run_loss / seen)
            curves["train_acc"].append(run_acc / seen)
            if log:
                log(f"{cfg.task} step {step}/{cfg.steps} loss {run_loss / seen:.4f} acc {run_acc / seen:.3f}")
            run_loss, run_acc, seen = 0.0, 0.0, 0
            if ckpt is not None:
                ckpt.save(step, model, opt, gen, {"curves": curves})
    info = {
        "config": asdict(cfg),
        "acc_n": accuracy(model, gym, cfg.items, cfg.eval_examples, cfg.seed),
        "acc_max": accuracy(model, gym, cfg.max_items, cfg.eval_examples, cfg.seed) if cfg.max_factor > 1 else None,
        "train_seconds": round(time.perf_counter() - start, 2),
        "parameters": sum(p.numel() for p in model.parameters()),
        "curves": curves,
    }
    if ckpt is not None:
        ckpt.clear()
    model.eval()
    return model, info


def default_cache() -> Path:
    return Path(os.environ.get("MASKLAB_CACHE", "cache"))


def save_teacher(model: EvidenceReader, info: dict, path: Path) -> None:
    """Write ``path.safetensors`` and ``path.json`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp))
    os.replace(tmp, path.with_suffix(".safetensors"))
    write_json(path.with_suffix(".json"), info)


def load_teacher(path: Path) -> tuple[EvidenceReader, dict]:
    info = read_json(path.with_suffix(".json"))
    known = TeacherConfig.__dataclass_fields__
    cfg = TeacherConfig(**{k: v for k, v in info["config"].items() if k in known})
    model = build_teacher(cfg)
    model.load_state_dict(load_file(str(path.with_suffix(".safetensors"))))
    model.eval()
    return model, info


def load_or_train(
    cfg: TeacherConfig, cache: Path | None = None, ckpt_dir: Path | None = None, log=None
) -> tuple[EvidenceReader, dict]:
    """The cached teacher for ``cfg``, training (and caching) it first if needed; on the run's
    device (:func:`masklab.util.device.current`)."""
    path = Path(cache or default_cache()) / "teachers" / cfg.key()
    if path.with_suffix(".json").exists() and path.with_suffix(".safetensors").exists():
        model, info = load_teacher(path)
        return model.to(devices.current()), {**info, "cached": True}
    model, info = train_teacher(cfg, ckpt_dir, log)
    save_teacher(model, info, path)
    return model, {**info, "cached": False}


# ----------------------------------------------------------------------------- untrained teachers

MIN_TEACHER_ACC = 0.5  # the studies' default --min-teacher-acc
MIN_TEACHER_ACC_HELP = (
    "a teacher whose held-out accuracy at N items is below this is called untrained: one warning on stderr, "
    "teacher_untrained in its runs' extra and a note on top of results.md (chance is about 1/N for the retrieval "
    "gyms and 1/(max_count+1) for aggregate; trained teachers reach 0.9-1.0)"
)


def untrained_teachers(runs: list[dict], threshold: float, acc: str = "teacher_acc_n") -> list[dict]:
    """``[{"task", "seed", "acc"}]`` for every run whose teacher's held-out accuracy ``metrics[acc]``
    is below ``threshold``, and ``extra["teacher_untrained"]`` set on every run (True/False)."""
    found = []
    for r in runs:
        value = r["metrics"].get(acc)
        bad = value is not None and value < threshold
        r.setdefault("extra", {})["teacher_untrained"] = bad
        if bad:
            found.append({"task": r["task"], "seed": r["seed"], "acc": value})
    return found


def untrained_note(found: list[dict], threshold: float) -> str:
    """One line naming the rows that rest on an untrained teacher ('' when none do)."""
    if not found:
        return ""
    which = ", ".join(f"{f['task']} (seed {f['seed']}: {f['acc']:.3f})" for f in found)
    return (
        f"**Untrained teacher**: held-out accuracy at N below {threshold:g} (`--min-teacher-acc`) for {which}; "
        f"every row of these tasks rests on it, and its evidence and routing metrics mean little."
    )


def warn_untrained(found: list[dict], threshold: float, study: str) -> None:
    """One loud warning on stderr when any teacher is untrained."""
    if found:
        print(f"masklab {study}: WARNING: " + untrained_note(found, threshold).replace("**", ""), file=sys.stderr)
