"""Bounded reads of everything that comes from outside: the strict JSON reader (duplicate keys, depth, size, lone
surrogates), files and stdin under a byte cap, JSON paths for errors, and the on-disk cache of derived artifacts.
Guide: docs/outside-json.md."""

from ctxlock.outside._diskcache import file_sha256
from ctxlock.outside._diskcache import load as load_cached
from ctxlock.outside._diskcache import store as store_cached
from ctxlock.outside._files import MAX_ARTIFACT_ENV, decode_utf8, max_artifact_bytes, read_artifact, read_input
from ctxlock.outside._json import (
    MAX_JSON_DEPTH,
    SYNTAX_ERROR,
    Utf8Policy,
    byte_offset,
    decode_bytes,
    loads_outside,
    loads_strict,
    to_plain,
)
from ctxlock.outside._paths import join_path

__all__ = [
    "MAX_ARTIFACT_ENV",
    "MAX_JSON_DEPTH",
    "SYNTAX_ERROR",
    "Utf8Policy",
    "byte_offset",
    "decode_bytes",
    "decode_utf8",
    "file_sha256",
    "join_path",
    "load_cached",
    "loads_outside",
    "loads_strict",
    "max_artifact_bytes",
    "read_artifact",
    "read_input",
    "store_cached",
    "to_plain",
]
