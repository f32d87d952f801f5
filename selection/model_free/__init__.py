"""Model-free ranking and data quality, on the raw rows: OutRank (scoring, streaming, sketches,
column codes, mutual information) and the data-quality report. No model is trained."""
