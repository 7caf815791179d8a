"""One router contract: every router ranks units through ``score`` (``Router.prune`` is the
same for all), the product's registry holds only product routers (the lab's controls and
references register in masklab.lab.routers), and no caller branches on a router's name or
probes a router's attributes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from masklab.context.router import Router
from masklab.context.routers import ROUTERS
from masklab.lab.routers import LAB_ROUTERS, REWRITERS, names
from masklab.lab.routers.registry import prune_one

ROOT = Path(__file__).resolve().parents[1] / "masklab"
# the modules that define and register routers (a router's own file names itself)
DEFINING = ("context/router.py", "context/routers/", "lab/routers/")
PRODUCT = ("context/", "integrations/")
# the callers that run routers by name: the product and the lab's router evaluations
CALLERS = PRODUCT + (
    "cli.py",
    "lab/realdocs.py",
    "lab/pipeline.py",
    "lab/train_router.py",
    "lab/studies/longctx.py",
    "lab/studies/prune.py",
)


def sources(under: tuple[str, ...] = ("",)) -> dict[str, ast.AST]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(under) and not rel.startswith(DEFINING):
            out[rel] = ast.parse(p.read_text())
    return out


def names_a_router(node: ast.AST) -> bool:
    """Whether an expression holds a router or its name (``name``, ``router``, ``cfg.router``, ...)."""
    text = ast.unparse(node)
    return text == "name" or "router" in text.lower()


def name_branches(tree: ast.AST, router_names: set[str]) -> list[str]:
    """``name == "bm25"``, ``router != "bm25"`` and ``cfg.router in ("bm25", ...)``: a router
    name written out beside an expression naming a router (a label kind or a results key that
    happens to be spelled like a router is no branch on a router)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, sides, sides[1:]):
            if isinstance(op, (ast.Eq, ast.NotEq)) and (names_a_router(left) or names_a_router(right)):
                lits = [s.value for s in (left, right) if isinstance(s, ast.Constant)]
            elif (
                isinstance(op, (ast.In, ast.NotIn))
                and isinstance(right, (ast.Tuple, ast.List, ast.Set))
                and names_a_router(left)
            ):
                lits = [e.value for e in right.elts if isinstance(e, ast.Constant)]
            else:
                continue
            found += [f"line {node.lineno}: {lit!r}" for lit in lits if lit in router_names]
    return found


def attribute_probes(tree: ast.AST) -> list[str]:
    """``getattr(router, "...", default)`` and ``hasattr(router, "...")`` on a router."""
    return [
        f"line {n.lineno}: {ast.unparse(n)}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id in ("getattr", "hasattr")
        and n.args
        and "router" in ast.unparse(n.args[0]).lower()
    ]


def test_no_router_overrides_how_a_request_is_pruned():
    every = [ROUTERS[n] for n in ROUTERS] + [LAB_ROUTERS[n] for n in LAB_ROUTERS]
    assert all(issubclass(cls, Router) for cls in every)
    assert not hasattr(Router, "choose")  # the lab's shorthand is a function of its own (lab/routers/registry.py)
    for method in ("prune", "prune_all", "checked"):
        assert [cls.name for cls in every if getattr(cls, method) is not getattr(Router, method)] == [], method
    assert not any(issubclass(REWRITERS[n], Router) for n in REWRITERS)  # a rewriter ranks no units: no Router


def test_the_product_registry_holds_no_research_router():
    assert set(ROUTERS).isdisjoint(set(LAB_ROUTERS) | set(REWRITERS))
    assert {"attention", "bm25+attention", "pruner-attention", "pruner-marks", "oracle-gold"} <= set(LAB_ROUTERS)
    assert names() == [*ROUTERS, *LAB_ROUTERS, *REWRITERS]


def test_list_routers_lists_only_the_product(capsys):
    from masklab.context.cli import list_routers

    list_routers()
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line and not line.startswith(" ")]
    from masklab.context.presses import PRESSES

    assert listed == [*ROUTERS, *PRESSES]


@pytest.mark.parametrize("rel", sorted(sources(CALLERS)))
def test_no_caller_branches_on_a_router_name(rel):
    assert name_branches(ast.parse((ROOT / rel).read_text()), set(names())) == []


@pytest.mark.parametrize("rel", sorted(sources(PRODUCT)))
def test_no_product_caller_probes_a_router_attribute(rel):
    assert attribute_probes(ast.parse((ROOT / rel).read_text())) == []


def test_no_keeps_units_flag_is_left():
    assert [p for p in ROOT.rglob("*.py") if "keeps_units" in p.read_text()] == []


def test_the_checks_find_what_they_look_for():
    tree = ast.parse(
        'if name == "longllmlingua" or cfg.router in ("pruner", "x") or "bm25" != router.name:\n'
        '    getattr(router, "keeps_units", True)\n'
        'if "bm25" in computed or labels == "attention":\n    pass\n'
    )
    assert name_branches(tree, set(names())) == ["line 1: 'longllmlingua'", "line 1: 'pruner'", "line 1: 'bm25'"]
    assert attribute_probes(tree) == ["line 2: getattr(router, 'keeps_units', True)"]


def test_one_score_per_unit_is_checked_for_one_document_and_for_passages():
    import torch

    from masklab.context import Request
    from masklab.text.document import Document
    from masklab.util.errors import MasklabError

    class Short(Router):
        name = "short"

        def score(self, doc, question):
            return torch.zeros(len(doc.units) - 1)

    with pytest.raises(MasklabError, match=r"returned scores of shape \(1,\) for 2 units; expected \(2,\)"):
        prune_one(Short(), Document(units=["One fact.", "Two facts."]), "Which?", 0.5)
    with pytest.raises(MasklabError, match=r"returned scores of shape \(1,\) for 2 units; expected \(2,\)"):
        Short().prune(Request("Which?", ["One fact.", "Two facts."], router=Short))


def help_texts(command: str) -> dict[str, str]:
    """``--flag`` -> its help line, of ``masklab COMMAND``."""
    from masklab.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.choices and command in a.choices).choices[command]
    return {a.option_strings[0]: a.help or "" for a in sub._actions if a.option_strings}


@pytest.mark.parametrize("command", ["compress", "serve"])
def test_every_router_a_help_text_names_is_accepted_and_takes_what_it_names(command):
    """The help names only routers the command accepts (no lab router), the default router,
    and for an option, exactly the routers that declare it."""
    import re

    from masklab.context.presses import PRESSES
    from masklab.context.router import DEFAULT_ROUTER, takers

    helps = help_texts(command)
    every = set(names()) | set(PRESSES) | {"attention"}
    for flag, text in helps.items():
        named = {w for w in re.findall(r"[a-z0-9]+(?:[-+][a-z0-9]+)*", text) if w in every}
        assert named <= set(ROUTERS) | set(PRESSES), (flag, named - set(ROUTERS) - set(PRESSES))
    if command == "compress":
        router = helps["--router"]
        assert f"default {DEFAULT_ROUTER}" in router and all(n in router for n in ROUTERS)
        for flag, option in (
            ("--router-file", "path"),
            ("--router-model", "router_model"),
            ("--int8", "int8"),
            ("--embedder", "embedder"),
        ):
            lead = helps[flag].split(":")[0]  # "pruner, pruner-ctx: ..." names the routers that take it
            assert sorted(w.strip() for w in lead.split(",")) == sorted(takers(option)), flag
