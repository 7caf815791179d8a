"""docs/design.md's layer table holds: a module imports (:func:`masklab.lab.revision.import_graph`,
top level and inside functions) only from its own layer or the layers above it; and the
product (``masklab.context``, ``masklab.integrations``) reaches nothing in the lab.

``LAYERS`` is that table, top to bottom: layer -> module prefixes under ``masklab.`` (a
package names every module in it; the longest prefix wins, so ``pretrained.cli`` is CLI).
"""

from __future__ import annotations

import pytest

from masklab.lab.revision import closure, graph_of, import_graph

LAYERS = {
    "utilities": ["util"],
    "attention priors": ["priors"],
    "models": ["models"],
    "text": ["text"],
    "pretrained": ["pretrained"],
    "product": ["context"],
    "integrations": ["integrations"],
    "lab run utilities": [
        "lab",
        "lab.revision",
        "lab.runs",
        "lab.executors",
        "lab.runner",
        "lab.worker",
        "lab.distributed",
        "lab.report",
        "lab.doctables",
        "lab.stats",
    ],
    "lab tasks and evidence": ["lab.tasks", "lab.evidence", "lab.routing", "lab.lm_evidence"],
    "lab routers": [
        "lab.routers",
        "lab.anchors",
        "lab.pipeline",
        "lab.labels",
        "lab.realdocs",
        "lab.train_router",
        "lab.train_pruner",
        "lab.train_ctx",
        "lab.train_passage",
        "lab.linear_routers",
    ],
    "training loop": ["lab.train"],
    "studies": ["lab.studies"],
    "CLI": ["cli", "pretrained.cli", "context.cli", "__main__"],
}
PRODUCT = ("masklab.context", "masklab.integrations")
LAB = "masklab.lab"


def layer_of(module: str) -> int | None:
    """Index in LAYERS of ``module``'s layer (None: not in the table)."""
    found = [
        (len(p), i)
        for i, prefixes in enumerate(LAYERS.values())
        for p in prefixes
        if module == f"masklab.{p}" or module.startswith(f"masklab.{p}.")
    ]
    return max(found)[1] if found else None


def test_every_module_has_a_layer():
    # the package itself imports nothing (its names resolve on first use)
    assert sorted(m for m in import_graph() if layer_of(m) is None) == ["masklab"]


def test_modules_import_only_from_their_layer_or_above():
    graph, names = import_graph(), list(LAYERS)
    edges = {(m, d) for m, deps in graph.items() for d in deps}
    upward = sorted(
        f"{m} ({names[layer_of(m)]}) imports {d} ({names[layer_of(d)]})"
        for m, d in edges
        if m != "masklab" and layer_of(d) > layer_of(m)
    )
    assert upward == []


def in_package(module: str, packages: tuple[str, ...] | str) -> bool:
    packages = (packages,) if isinstance(packages, str) else packages
    return any(module == p or module.startswith(p + ".") for p in packages)


def lab_reached_by_product(graph: dict[str, set[str]]) -> list[str]:
    """``product module -> lab module`` for every lab module a product module reaches, by
    imports anywhere in the source (top level and inside functions) and through other modules."""
    return sorted(
        f"{m} -> {d}" for m in graph if in_package(m, PRODUCT) for d in closure(m, graph) if in_package(d, LAB)
    )


def test_the_product_reaches_nothing_in_the_lab():
    # the product's CLI (masklab compress) and serve are product too: a user needs no lab code
    assert lab_reached_by_product(import_graph()) == []


@pytest.mark.parametrize(
    "src",
    [
        "from masklab.lab import realdocs\n",
        "def f():\n    from masklab.lab.realdocs import run\n",
        "def f():\n    import masklab.lab.realdocs\n",
        "def f():\n    from masklab.text import query\n",  # through another module
    ],
)
def test_the_product_check_finds_a_lab_import_even_inside_a_function(src):
    files = {
        "masklab.context.compress": src.encode(),
        "masklab.lab.realdocs": b"x = 1\n",
        "masklab.text.query": b"def g():\n    from masklab.lab import realdocs\n",
        "masklab.lab": b"",
        "masklab.text": b"",
    }
    if "text" not in src:
        files["masklab.text.query"] = b""
    assert "masklab.context.compress -> masklab.lab.realdocs" in lab_reached_by_product(graph_of(files))
