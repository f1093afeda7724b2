"""DuckDB SQL over named pandas tables, registering only the tables a query names."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import pandas as pd


def query_tables(query: str, names: Iterable[str], table: Callable[[str], pd.DataFrame],
                 ) -> pd.DataFrame:
    """Run `query`; each of `names` it mentions is registered as `table(name)` (read in
    place, and built only when the query needs it)."""
    import duckdb

    con = duckdb.connect()
    try:
        for name in names:
            if re.search(rf"\b{name}\b", query, flags=re.IGNORECASE):
                con.register(name, table(name))
        return con.execute(query).df()
    finally:
        con.close()
