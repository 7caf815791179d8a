"""The one Registry class behind every name -> object table."""

import pytest

from masklab.util.errors import MasklabError
from masklab.util.registry import Registry


def test_register_lookup_and_error():
    reg: Registry = Registry("widget", instantiate=True)

    @reg.register("b")
    class B:
        pass

    @reg.register("a")
    class A:
        pass

    assert list(reg) == ["b", "a"] and reg.names() == ["b", "a"] and len(reg) == 2
    assert isinstance(reg["a"], A) and A.name == "a" and "b" in reg and "c" not in reg
    with pytest.raises(MasklabError, match="unknown widget 'c'; choose from b, a$"):
        reg["c"]
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(A)


def test_functions_are_kept_as_they_are():
    reg: Registry = Registry("fn")
    f = reg.register("double")(lambda x: 2 * x)
    assert reg["double"] is f and reg["double"](3) == 6


def test_every_registry_is_a_registry():
    from masklab.lab.evidence.attention_targets import AGGREGATES, SELECTIONS
    from masklab.lab.evidence.search import SEARCHES
    from masklab.priors.qk_init import QK_INITS
    from masklab.lab.routing.routers import TOKEN_ROUTERS
    from masklab.lab.routing.sparse import SELECTORS
    from masklab.priors.structures import DESIGNS
    from masklab.lab.tasks.evidence_gyms import GYMS

    for reg in (AGGREGATES, SELECTIONS, SEARCHES, QK_INITS, TOKEN_ROUTERS, SELECTORS, DESIGNS, GYMS):
        assert isinstance(reg, Registry) and len(reg) > 0
        with pytest.raises(MasklabError, match=f"unknown {reg.kind} 'nope'; choose from {list(reg)[0]}"):
            reg["nope"]
