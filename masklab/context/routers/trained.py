"""``evidence`` and ``attention``: the trained routers (:mod:`masklab.context.routers.features`).

Each model's pair ships in ``masklab/context/weights/<model>.safetensors`` (+ ``.json``
meta: the command that trained it, its data, code hash and label cost);
``masklab train-router --model M`` rebuilds it. The router may read another model than
the one that answers (``router_model``, ``--router-model``): its features come from that
model's first layers and its own router file, while the answering model's tokenizer still
counts the budget's tokens; a model with no router of its own (a model folder) is routed
by :data:`DEFAULT_ROUTER_MODEL`'s, with a note saying so. A document longer than one router pass
(the model's window, at most :data:`WINDOW_TOKENS`) is scored window by window, one pass of
the first layers per window (with ``progress``, a bar on standard error counts the windows).
"""

from __future__ import annotations

from pathlib import Path

import torch

from masklab.context.router import ROUTERS, Router, Scores
from masklab.context.routers.features import ROUTER_LAYERS, features, load_routers, router_stem, same_model
from masklab.util.errors import MasklabError

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
WINDOW_TOKENS = 8192
DEFAULT_ROUTER_MODEL = "smollm2-135m"  # the smallest packaged model that ships a router
FEW_LABELLED = 100  # a router fitted on fewer labelled examples carries a warning (the shipped ones: 200+)


def shipped(model: str) -> Path:
    """Where the routers shipped for ``model`` (a registered name) live (no suffix)."""
    return WEIGHTS / model


def ships(model: str) -> bool:
    """Whether routers ship for ``model``: a registered model name, never a folder or file."""
    from masklab.pretrained.models import MODELS

    return model in MODELS and shipped(model).with_suffix(".json").is_file()


class TrainedRouter(Router):
    """A :class:`~masklab.context.routers.features.LinearRouter` over the first layers of a model; ``path``:
    a router file made by ``masklab train-router`` (default: the shipped one).
    ``router_model``: the model whose first layers and router rank the units (a packaged
    name, a model folder or a loaded model; default ``lm`` where a router ships for it, else
    :data:`DEFAULT_ROUTER_MODEL`); ``lm`` answers and counts tokens either way.
    ``progress``: a bar on standard error while a document of several windows is scored.
    ``notes``: which model ranked when it is not ``lm``, and a warning for a router fitted on
    few examples (they reach :attr:`Pruned.notes`)."""

    reads_model = True
    options = ("path", "router_model", "progress")
    fill = True
    kind = ""

    def __init__(
        self,
        lm=None,
        path: str | Path | None = None,
        routers: dict | None = None,
        meta: dict | None = None,
        progress: bool = False,
        router_model=None,
    ) -> None:
        super().__init__(lm)
        self.progress = progress
        self.reader = self._reader(router_model, own_file=path is not None or routers is not None)
        name = self.reader.name
        if routers is None:
            if path is None and not ships(name):
                raise MasklabError(
                    f"no {self.kind} router ships for model {name!r}: route with a packaged one "
                    f"(--router-model {DEFAULT_ROUTER_MODEL}), or train one with `masklab train-router "
                    f"--model {name} --out DIR` and pass --router-file "
                    f"DIR/{router_stem(name)}.safetensors"
                )
            routers, meta = load_routers(Path(path) if path is not None else shipped(name))
        if self.kind not in routers:
            raise MasklabError(f"the router file holds {', '.join(routers)}, not {self.kind}")
        self.router, self.meta = routers[self.kind], meta or {}
        self.layers = int(self.meta.get("layers", ROUTER_LAYERS))
        self.feature_set = self.meta.get("features")
        trained_for = self.meta.get("model")
        if trained_for and not same_model(trained_for, name):
            raise MasklabError(
                f"this router was trained for {trained_for!r}, not {name!r}: pass --router-model "
                f"{trained_for} (router_model= in Python) to rank with the model it was trained for"
            )
        if self.reader is not lm:
            why = f"{lm.name} ships no {self.kind} router: " if router_model is None else ""
            self.notes.append(
                f"{why}{name}'s {self.kind} router ranked the units (--router-model picks the ranking "
                f"model); {lm.name}'s tokenizer counted the budget"
            )
        labelled = self.meta.get("data", {}).get("labelled")
        if labelled is not None and labelled < FEW_LABELLED:
            self.notes.append(
                f"this {self.kind} router was fitted on only {labelled} labelled examples (fewer than "
                f"{FEW_LABELLED}): its ranking may be poor; label more with train-router --examples"
            )

    def _reader(self, router_model, own_file: bool):
        """The loaded model whose first layers the router reads (class docstring)."""
        lm = self.lm
        if router_model is None:
            if own_file or ships(lm.name):
                return lm
            router_model = DEFAULT_ROUTER_MODEL
        if not isinstance(router_model, (str, Path)):
            return router_model  # a LoadedModel
        if same_model(str(router_model), lm.name):
            return lm
        from masklab.pretrained.models import check_models, load

        check_models([str(router_model)])
        return load(str(router_model), device=str(lm.model.device))

    def windows(self, lengths: list[int], question: str) -> list[range]:
        """Consecutive units whose tokens fit one router pass together with the question."""
        window = min(int(getattr(self.reader.model.config, "max_position_embeddings", WINDOW_TOKENS)), WINDOW_TOKENS)
        room = window - len(self.reader.tokenizer(question)["input_ids"]) - 8
        out, start, used = [], 0, 0
        for i, n in enumerate(lengths):
            if i > start and used + n > room:
                out.append(range(start, i))
                start, used = i, 0
            used += n
        out.append(range(start, len(lengths)))
        return out

    def score(self, doc, question):
        return self.read(doc, [question]).values[0]

    def read(self, doc, questions):
        """Each question's scores, read window by window (:meth:`windows`); ``windows``: how many."""
        kind = {"kind": self.feature_set} if self.feature_set else {}
        values, most = [], 1
        for question in questions:
            wins = self.windows(doc.lengths(self.reader.tokenizer), question)
            most = max(most, len(wins))
            values.append(
                torch.cat(
                    [
                        self.router.score(
                            features(self.reader, doc.units[w.start : w.stop], question, self.layers, **kind)
                        )
                        for w in self._bar(wins)
                    ]
                )
            )
        return Scores(values, windows=most)

    def _bar(self, wins: list[range]):
        if not self.progress or len(wins) < 2:  # one window: one pass, nothing to count
            return wins
        import sys

        from tqdm import tqdm

        return tqdm(wins, desc=f"{self.kind} router", unit="window", file=sys.stderr)


@ROUTERS.register("evidence")
class EvidenceRouter(TrainedRouter):
    """Trained on the causal evidence sets of the LM's own answers."""

    use = "contexts like its training families: templated facts restated later or chained"

    kind = "evidence"
