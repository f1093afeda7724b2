"""examples/analysis.ipynb runs top to bottom on a headless kernel, so it cannot rot."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "analysis.ipynb"


@pytest.mark.slow
def test_analysis_notebook_executes() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "host" in text.lower() and "[high]" in text  # the findings cell printed findings
    assert any("image/png" in o.get("data", {}) for o in outputs), "the plot cell drew a figure"
