"""Moved to :mod:`masklab.pretrained.hf` (commit a80712e); this old path is an alias, with a DeprecationWarning, for one release."""

from masklab.moved import alias_module

alias_module(__name__, "masklab.pretrained.hf")
