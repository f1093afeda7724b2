"""One module per dashboard page, each with `PATH`, `TITLE`, `layout(trace, name, params, ctx)`
and `register(app, ctx)` for its callbacks; `neuron_explorer.webapp.app.PAGES` lists them in
menu order."""
