"""Loaded by Python children of a recorded program (this folder leads PYTHONPATH).

When `NEURON_EXPLORER_RECORD` is set, the child starts recording itself right after
it imports torch; processes that never import torch pay nothing. Any other
`sitecustomize` on the path still runs.
"""

import os
import sys


def _chain_other_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    this = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        import contextlib
        import importlib

        with contextlib.suppress(ImportError):
            importlib.import_module("sitecustomize")
    finally:
        sys.path[:] = saved
        if this is not None:
            sys.modules["sitecustomize"] = this


class _RecordAfterTorchImport:
    """A meta-path finder that starts the recording once `torch` has been imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_record(module):
            exec_module(module)
            try:
                from neuron_explorer.collectors.child_processes import start_from_environment

                start_from_environment()
            except Exception as exc:  # noqa: BLE001 - never break the child program
                print(f"neuron-explorer: not recording process {os.getpid()}: {exc}",
                      file=sys.stderr)

        spec.loader.exec_module = exec_then_record
        return spec


if os.environ.get("NEURON_EXPLORER_RECORD"):
    if "torch" in sys.modules:
        from neuron_explorer.collectors.child_processes import start_from_environment

        start_from_environment()
    else:
        sys.meta_path.insert(0, _RecordAfterTorchImport())
_chain_other_sitecustomize()
