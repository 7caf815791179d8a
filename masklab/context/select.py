"""Moved to :mod:`masklab.selection` (commit 2c8e428); this old path is an alias, with a DeprecationWarning, for one release."""

from masklab.moved import alias_module

alias_module(__name__, "masklab.selection")
