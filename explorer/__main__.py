"""`python -m neuron_explorer` runs the CLI."""

import sys

from neuron_explorer.cli import main

sys.exit(main())
