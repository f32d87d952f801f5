"""Embedding dimension search: mixed-dim tables, DNIS, iHAS (filled by later work)."""
