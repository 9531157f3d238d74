"""`ctxlock batch`: a file of requests into training data (Parquet shards of `input_ids` and `labels`, a manifest,
an errors file), across worker processes or a Ray cluster, resumable and byte-identical for any worker count."""
