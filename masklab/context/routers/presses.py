"""Moved to :mod:`masklab.context.presses` (commit b97958f); this old path is an alias, with a DeprecationWarning, for one release."""

from masklab.moved import alias_module

alias_module(__name__, "masklab.context.presses")
