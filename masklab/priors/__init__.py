"""Attention priors: the one attention core, bias terms, structure builders, QK inits."""
