"""Selectors that read a model at the seam: LeAP (and its fusion), the gate-based AutoField,
AdaFS, LPFS and OptFS, the sensitivity scores SHARK and SFS, and permutation importance."""
