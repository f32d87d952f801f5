"""Feature importance and selection: OutRank, permutation importance, LeAP (filled by later work)."""
