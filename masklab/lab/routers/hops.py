"""The second hop's measurement: product routers with ``hops = 2`` (:meth:`masklab.context.router.Router.read_hops`:
the question again with its best unit's text, each unit's higher score), measured by name beside the same
routers with one hop (``masklab realdocs --routers dense,dense+hop2``); ``cross-hop1``: the lab's cross
pruner (:mod:`masklab.lab.routers.cross`; its file, ``path``, chose two hops on val) with one."""

from __future__ import annotations

from masklab.lab.routers.cross import CrossRouter
from masklab.context.routers.dense import Dense
from masklab.context.routers.pruner import ContextPruner, Pruner
from masklab.lab.routers.registry import LAB_ROUTERS


@LAB_ROUTERS.register("dense+hop2")
class DenseTwoHops(Dense):
    use = "a research comparison: dense with a second hop"
    hops = 2


@LAB_ROUTERS.register("pruner+hop2")
class PrunerTwoHops(Pruner):
    use = "a research comparison: the pruner with a second hop"
    hops = 2


@LAB_ROUTERS.register("pruner-ctx+hop2")
class ContextPrunerTwoHops(ContextPruner):
    use = "a research comparison: the context pruner with a second hop"
    hops = 2


@LAB_ROUTERS.register("cross-hop1")
class CrossOneHop(CrossRouter):
    use = "a research comparison: the cross pruner without its second hop"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hops = 1  # whatever its file chose on val
