"""docs/design.md's layer table holds: a module imports (:func:`masklab.lab.revision.import_graph`,
top level and inside functions) only from its own layer or the layers above it.

``LAYERS`` is that table, top to bottom: layer -> module prefixes under ``masklab.`` (a
package names every module in it; the longest prefix wins, so ``pretrained.cli`` is CLI).
"""

from __future__ import annotations

from masklab.lab.revision import import_graph

LAYERS = {
    "leaves": ["errors", "registry", "flags", "files", "device", "revision"],
    "attention core": ["attention"],
    "bias terms": ["bias", "structures", "qk_init", "structures_from_evidence"],
    "run utilities": ["runs", "executors", "runner", "worker", "distributed", "report", "doctables"],
    "models": ["models"],
    "documents": ["document", "selection", "query", "inputs", "stats"],
    "tasks": ["tasks"],
    "evidence, routing, pretrained": ["evidence", "routing", "pretrained"],
    "context": ["context"],
    "integrations": ["integrations"],
    "training loop": ["train"],
    "studies": ["studies"],
    "CLI": ["cli", "pretrained.cli", "context.cli", "__main__"],
}


def layer_of(module: str) -> int | None:
    """Index in LAYERS of ``module``'s layer (None: not in the table)."""
    found = [(len(p), i) for i, prefixes in enumerate(LAYERS.values()) for p in prefixes
             if module == f"masklab.{p}" or module.startswith(f"masklab.{p}.")]
    return max(found)[1] if found else None


def test_every_module_has_a_layer():
    # the package itself imports nothing (its names resolve on first use)
    assert sorted(m for m in import_graph() if layer_of(m) is None) == ["masklab"]


def test_modules_import_only_from_their_layer_or_above():
    graph, names = import_graph(), list(LAYERS)
    edges = {(m, d) for m, deps in graph.items() for d in deps}
    upward = sorted(f"{m} ({names[layer_of(m)]}) imports {d} ({names[layer_of(d)]})" for m, d in edges
                    if m != "masklab" and layer_of(d) > layer_of(m))
    assert upward == []
