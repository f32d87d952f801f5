"""Data larger than memory: encoders fitted chunk by chunk, the spill, byte-sized chunks and
shards, the two-pass shard preparation (on one machine or a Dask cluster), streamed batches,
split views and bounded raw samples."""
