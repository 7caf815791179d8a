"""No import cycles inside masklab (a cycle makes import order matter and hides bugs).

The graph (:func:`masklab.lab.revision.import_graph`, which also decides which code a run's
hash covers) is built from the source with ``ast``: every ``import masklab.x`` and
``from masklab[.x] import y`` anywhere in a module (top level *and* inside functions,
where cycles are usually hidden) is an edge from that module to the module it names.
"""

from __future__ import annotations

from masklab.lab.revision import import_graph


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
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_detector_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "masklab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "runner.py").write_text("def f():\n    from masklab import distributed\n")
    (pkg / "distributed.py").write_text("from masklab.lab.runner import f\n")
    assert find_cycle(import_graph(pkg)) == ["masklab.lab.distributed", "masklab.lab.runner", "masklab.lab.distributed"]
    (pkg / "distributed.py").write_text("from masklab.util.errors import MasklabError\n")
    assert find_cycle(import_graph(pkg)) is None


def test_only_the_entry_point_imports_the_cli():
    # the CLI imports every study (by name, at run time), so a study importing it is a cycle
    users = sorted(m for m, deps in import_graph().items() if "masklab.cli" in deps)
    assert users == ["masklab.__main__"]
