"""`ctxlock batch`: a file of requests into training data (Parquet shards of `input_ids` and `labels`, a manifest,
an errors file), across worker processes or a Ray cluster, resumable and byte-identical for any worker count."""

from ctxlock.batch._run import BatchOptions, Progress, check_paths, run_batch

__all__ = ["BatchOptions", "Progress", "check_paths", "run_batch"]
