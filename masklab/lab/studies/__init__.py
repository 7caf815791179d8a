"""One module per study: a config dataclass, ``run_one`` (one seed), ``run`` and the paper's numbers."""
