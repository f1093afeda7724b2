"""The dashboard: a Dash app over the explorer's tables (`neuron-explorer view`)."""
