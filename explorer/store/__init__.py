"""The columnar trace store: a trace's tables as Parquet files in one folder.

`parquet.py` writes and reads one trace's folder (the format `convert` writes and
the cache keeps); `cache.py` keeps a folder per trace file under the user's cache,
keyed by the file's path, size, times and a fingerprint of its bytes, so that a
reload reads Parquet instead of parsing the trace again.
"""
