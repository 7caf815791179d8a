"""Routers that pick which context items a teacher reads, their training, sparse inference.

Library entry points: :class:`TokenRouter` and :data:`TOKEN_ROUTERS` (``transformer``, ``independent``),
:func:`train_router` (on causal evidence, attention or gold targets) and
:func:`sparse_answer` (route, keep a budget of items, let the teacher answer from them).
"""

from masklab.lab.routing.routers import TOKEN_ROUTERS, TokenRouter, build_router, transformer_flops
from masklab.lab.routing.sparse import SELECTORS, keep_mask, parse_budget, sparse_answer, teacher_answer
from masklab.lab.routing.train import router_loss, train_router

__all__ = [
    "TOKEN_ROUTERS",
    "SELECTORS",
    "TokenRouter",
    "build_router",
    "keep_mask",
    "parse_budget",
    "router_loss",
    "sparse_answer",
    "teacher_answer",
    "train_router",
    "transformer_flops",
]
