"""Figures of traces and runs (plotly), for notebooks and the dashboard alike.

`trace.plot` and `run.plot` (see `accessor.py`) return Figures; the modules below
build them from the explorer's analyses, which stay pure tables. Plotly is imported
only when a figure is made.
"""

from neuron_explorer.plot.accessor import RunPlot, TracePlot, compare_breakdowns
from neuron_explorer.plot.options import options

__all__ = ["RunPlot", "TracePlot", "compare_breakdowns", "options"]
