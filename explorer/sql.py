"""DuckDB SQL over named tables, registering only the tables a query names.

A table kept as Parquet (a cached or converted trace, a run's ranks) is a view over
its files, read by DuckDB as the query needs it (out of core: a run larger than
memory can be queried); any other is a pandas frame, read in place.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

import pandas as pd
from neuron_explorer.common.errors import UnknownTableError


def query_tables(query: str, names: Iterable[str], table: Callable[[str], pd.DataFrame],
                 parquet: Callable[[str], str | Mapping[int, str] | None] | None = None,
                 ) -> pd.DataFrame:
    """Run `query`; each of `names` it mentions is a view over `parquet(name)` where that
    gives files (one file, or one per rank: the view adds a `rank` column), else
    `table(name)` (built only when the query needs it)."""
    import duckdb

    names = list(names)
    con = duckdb.connect()
    try:
        for name in names:
            if not re.search(rf"\b{name}\b", query, flags=re.IGNORECASE):
                continue
            files = parquet(name) if parquet is not None else None
            if files:
                con.execute(f"CREATE VIEW {name} AS {_select(files)}")
            else:
                con.register(name, _plain_texts(table(name)))
        try:
            return con.execute(query).df()
        except duckdb.CatalogException as exc:
            missing = re.search(r"Table with name (\S+) does not exist", str(exc))
            if not missing:
                raise
            # DuckDB's own hint names its catalog ("Did you mean pg_sequences?")
            raise UnknownTableError(
                f"no table {missing.group(1)!r} to query: the tables are "
                f"{', '.join(names)}") from None
    finally:
        con.close()


def _plain_texts(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with its categorical text columns as strings: DuckDB would read those as
    ENUMs, and a query's result should not depend on whether the table came from a frame
    or from its Parquet file (read as VARCHAR)."""
    texts = {name: "str" for name, dtype in frame.dtypes.items()
             if isinstance(dtype, pd.CategoricalDtype)}
    return frame.astype(texts) if texts else frame


def _select(files: str | Mapping[int, str]) -> str:
    if isinstance(files, str):
        return f"SELECT * FROM read_parquet({_quoted(files)})"
    return " UNION ALL BY NAME ".join(
        f"SELECT CAST({int(rank)} AS BIGINT) AS rank, * FROM read_parquet({_quoted(f)})"
        for rank, f in files.items())


def _quoted(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"
