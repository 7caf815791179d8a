"""One registry class for everything chosen by name (QK inits, searches, selectors,
routers, gyms, attention aggregates/selections, prior designs).

    SEARCHES = Registry("search")

    @SEARCHES.register("loo")
    class LeaveOneOut(EvidenceSearch): ...

    SEARCHES["loo"]        # the object; an unknown name raises MasklabError
    list(SEARCHES)         # names, in registration order

With ``instantiate=True`` the registry keeps an instance of each registered class (for
stateless strategy objects); otherwise it keeps what was decorated (a class or a function).
Registered classes get a ``name`` attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from masklab.util.errors import unknown

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> object, in registration order; ``kind`` names the thing in error messages."""

    def __init__(self, kind: str, instantiate: bool = False, items: dict[str, T] | None = None) -> None:
        self.kind = kind
        self.instantiate = instantiate
        self._items: dict[str, T] = dict(items or {})

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator: register the decorated class or function under ``name``."""

        def wrap(obj: Any) -> Any:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            if isinstance(obj, type):
                obj.name = name
            self._items[name] = obj() if self.instantiate else obj
            return obj

        return wrap

    def __getitem__(self, name: str) -> T:
        if name not in self._items:
            raise unknown(self.kind, name, self._items)
        return self._items[name]

    def __delitem__(self, name: str) -> None:
        """Remove ``name`` (tests that register a throw-away entry clean up with this)."""
        del self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> list[str]:
        return list(self._items)

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._items)})"
