"""No import cycles inside masklab (a cycle makes import order matter and hides bugs).

The graph (:func:`masklab.lab.revision.import_graph`, which also decides which code a run's
hash covers) is built from the source with ``ast``: every ``import masklab.x`` and
``from masklab[.x] import y`` anywhere in a module (top level *and* inside functions,
where cycles are usually hidden) is an edge from that module to the module it names, and
to every package above that module that the importing module is not inside (importing
``masklab.a.b`` from outside ``masklab.a`` runs ``masklab/a/__init__.py`` first, and a
package's ``__init__`` that imports its submodules closes a cycle there).
"""

from __future__ import annotations

from masklab.lab.revision import import_graph


def with_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` plus an edge from each module to the packages above the modules it imports,
    where it is not inside them itself."""

    def above(m: str, d: str) -> set[str]:
        parts = d.split(".")
        return {
            p
            for p in (".".join(parts[:i]) for i in range(2, len(parts)))
            if p in graph and m != p and not m.startswith(p + ".")
        }

    return {m: deps | {p for d in deps for p in above(m, d)} for m, deps in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle ``[a, b, ..., a]`` or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_no_import_cycles():
    cycle = find_cycle(with_packages(import_graph()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_detector_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "masklab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("def f():\n    from masklab import two\n")
    (pkg / "two.py").write_text("from masklab.one import f\n")
    assert find_cycle(import_graph(pkg)) == ["masklab.one", "masklab.two", "masklab.one"]
    (pkg / "two.py").write_text("x = 1\n")
    assert find_cycle(import_graph(pkg)) is None


def test_the_detector_finds_a_cycle_through_a_package_init(tmp_path):
    """The cycle context/trained.py had: a module outside a package imports one of its
    submodules (late), the package's __init__ imports a submodule that imports the module."""
    pkg = tmp_path / "masklab"
    (pkg / "routers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "features.py").write_text("def f():\n    from masklab.routers.bm25 import g\n")
    (pkg / "routers" / "__init__.py").write_text("from masklab.routers import bm25, trained\n")
    (pkg / "routers" / "bm25.py").write_text("def g():\n    pass\n")
    (pkg / "routers" / "trained.py").write_text("from masklab.features import f\n")
    assert find_cycle(import_graph(pkg)) is None  # the plain graph misses it
    assert find_cycle(with_packages(import_graph(pkg))) == [
        "masklab.features",
        "masklab.routers",
        "masklab.routers.trained",
        "masklab.features",
    ]
    (pkg / "features.py").unlink()
    (pkg / "routers" / "features.py").write_text("def f():\n    from masklab.routers.bm25 import g\n")
    (pkg / "routers" / "trained.py").write_text("from masklab.routers.features import f\n")
    assert find_cycle(with_packages(import_graph(pkg))) is None  # inside the package its __init__ has run


def test_only_the_entry_point_imports_the_cli():
    # the CLI imports every study (by name, at run time), so a study importing it is a cycle
    users = sorted(m for m, deps in import_graph().items() if "masklab.cli" in deps)
    assert users == ["masklab.__main__"]
