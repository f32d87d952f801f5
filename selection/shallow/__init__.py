"""Shallow baselines on the encoded training rows: Lasso, GBDT, random forest and LightGBM
importances, and the tabular sampling they share."""
