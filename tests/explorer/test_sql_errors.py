"""trace.sql errors a user can cause: one message naming the thing and the fix."""

from __future__ import annotations

import neuron_explorer
import pytest
from neuron_explorer.common.errors import UnknownTableError


def test_sql_naming_a_table_the_trace_lacks_lists_the_tables(
        basic_pf: neuron_explorer.Trace) -> None:
    """DuckDB alone says 'Did you mean "pg_sequences"?' for `from kernel`."""
    with pytest.raises(UnknownTableError, match="no table 'kernel'.*kernels") as info:
        basic_pf.sql("select count(*) from kernel")
    assert "pg_" not in str(info.value)
