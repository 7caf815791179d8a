"""``evidence`` and ``attention``: the trained routers (:mod:`masklab.context.trained`).

Each model's pair ships in ``masklab/context/weights/<model>.safetensors`` (+ ``.json``
meta: the command that trained it, its data, code hash and label cost);
``masklab train-router --model M`` rebuilds it. A document longer than one router pass
(the model's window, at most :data:`WINDOW_TOKENS`) is scored window by window, one pass of
the first layers per window (with ``progress``, a bar on standard error counts the windows).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from masklab.context.router import ROUTERS, Router
from masklab.context.trained import ROUTER_LAYERS, features, load_routers
from masklab.errors import MasklabError

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
WINDOW_TOKENS = 8192


def shipped(model: str) -> Path:
    """Where the routers shipped for ``model`` live (no suffix)."""
    return WEIGHTS / model


def shipped_digest(model: str) -> str | None:
    """12 hex digits of sha256 over the weights shipped for ``model`` (None where none ship):
    what names those routers in a run's settings, so shipping new weights redoes the runs."""
    path = shipped(model).with_suffix(".safetensors")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else None


class TrainedRouter(Router):
    """A :class:`~masklab.context.trained.LinearRouter` over the LM's first layers; ``path``:
    a router file (no suffix) made by ``masklab train-router`` (default: the shipped one).
    ``progress``: a bar on standard error while a document of several windows is scored."""

    needs_model = True
    fill = True
    kind = ""

    def __init__(self, lm=None, path: str | Path | None = None, routers: dict | None = None, meta: dict | None = None,
                 progress: bool = False) -> None:
        super().__init__(lm)
        self.progress = progress
        if routers is None:
            where = Path(path) if path is not None else shipped(lm.name)
            if path is None and not where.with_suffix(".json").is_file():
                raise MasklabError(f"no {self.kind} router ships for model {lm.name!r}; train one with "
                                   f"`masklab train-router --model {lm.name} --out DIR` and pass DIR/{lm.name} "
                                   "(--router-file, or path= in Python)")
            routers, meta = load_routers(where)
        if self.kind not in routers:
            raise MasklabError(f"the router file holds {', '.join(routers)}, not {self.kind}")
        self.router, self.meta = routers[self.kind], meta or {}
        self.layers = int(self.meta.get("layers", ROUTER_LAYERS))
        self.feature_set = self.meta.get("features")
        trained_for = self.meta.get("model")
        if trained_for and trained_for != lm.name:
            raise MasklabError(f"this router was trained for {trained_for!r}, not {lm.name!r}")

    def windows(self, lengths: list[int], question: str) -> list[range]:
        """Consecutive units whose tokens fit one router pass together with the question."""
        window = min(int(getattr(self.lm.model.config, "max_position_embeddings", WINDOW_TOKENS)), WINDOW_TOKENS)
        room = window - len(self.lm.tokenizer(question)["input_ids"]) - 8
        out, start, used = [], 0, 0
        for i, n in enumerate(lengths):
            if i > start and used + n > room:
                out.append(range(start, i))
                start, used = i, 0
            used += n
        out.append(range(start, len(lengths)))
        return out

    def score(self, doc, question):
        wins = self.windows(doc.lengths(self.tokenizer), question)
        kind = {"kind": self.feature_set} if self.feature_set else {}
        parts = [self.router.score(features(self.lm, doc.units[w.start:w.stop], question, self.layers, **kind))
                 for w in self._bar(wins)]
        self.last_windows = len(wins)
        return torch.cat(parts)

    def _bar(self, wins: list[range]):
        if not self.progress or len(wins) < 2:  # one window: one pass, nothing to count
            return wins
        import sys

        from tqdm import tqdm

        return tqdm(wins, desc=f"{self.kind} router", unit="window", file=sys.stderr)


@ROUTERS.register("evidence")
class EvidenceRouter(TrainedRouter):
    """Trained on the causal evidence sets of the LM's own answers."""

    kind = "evidence"


@ROUTERS.register("attention")
class AttentionRouter(TrainedRouter):
    """The same features, data and model class, trained on the LM's most attended units."""

    kind = "attention"
