"""Generative recommendation with semantic IDs (filled by later work)."""
