"""Embedding dimension search: the search base class and registry, uniform and MDE baselines,
DNIS and iHAS, and ``salience dims``."""
