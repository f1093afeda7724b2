"""Figure settings, set once per notebook: `neuron_explorer.plot.options.interactive = False`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PlotOptions:
    # None: the timeline is a FigureWidget in Jupyter when ipywidgets and anywidget are
    # installed; False: always a static Figure (a notebook exported to HTML); True: always a widget.
    interactive: bool | None = None


options = PlotOptions()
