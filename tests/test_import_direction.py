"""Imports run one way: common -> backend -> collectors -> explorer -> webapp. Every module's
imports (at any depth: inside functions too) are read from its source; a module may
import its own layer and those below it, and the explorer reaches the backend and the
collectors only from inside functions (loading a trace or the rules never loads the
device)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# top folder -> (package prefix, layer); backend/nki is `neuron_explorer.nki`
FOLDERS = {"common": ("neuron_explorer.common", 0), "backend/nki": ("neuron_explorer.nki", 1),
           "backend": ("neuron_explorer.backend", 1),
           "collectors": ("neuron_explorer.collectors", 2),
           "workloads": ("neuron_explorer.workloads", 2), "explorer": ("neuron_explorer", 3),
           "webapp": ("neuron_explorer.webapp", 4)}
LAYER_OF = {"common": 0, "backend": 1, "nki": 1, "collectors": 2, "workloads": 2, "webapp": 4}
EXPLORER = 3
ROOT_ATTRIBUTES = {"__version__"}  # the package's own metadata, importable from any layer


def _modules() -> list[tuple[str, int, Path]]:
    """(module name, layer, file) of every module of the package."""
    out = []
    for folder, (prefix, layer) in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder)
            if folder == "backend" and rel.parts[0] == "nki" or "bootstrap" in rel.parts:
                continue  # nki: its own entry; bootstrap: copied into the user's program
            parts = [p for p in rel.with_suffix("").parts if p != "__init__"]
            out.append((".".join([prefix, *parts]), layer, path))
    return out


def _target_layer(name: str) -> int | None:
    """The layer of an imported `neuron_explorer...` name (None: not ours)."""
    parts = name.split(".")
    if parts[0] != "neuron_explorer":
        return None
    if len(parts) == 1:
        return EXPLORER
    if parts[1] in ROOT_ATTRIBUTES:
        return 0
    return LAYER_OF.get(parts[1], EXPLORER)


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported name, at module level, line) of each import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in top, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "neuron_explorer":
                found += [(f"neuron_explorer.{a.name}", id(node) in top, node.lineno)
                          for a in node.names]
            else:
                found.append((node.module, id(node) in top, node.lineno))
    return found


def _violations() -> list[str]:
    out = []
    for module, layer, path in _modules():
        for name, module_level, line in _imports(path):
            target = _target_layer(name)
            if target is None or target <= layer and not (
                    layer == EXPLORER and target in (1, 2) and module_level):
                continue
            why = ("above it" if target > layer else
                   "at module level (the explorer reaches the backend and the collectors "
                   "inside functions)")
            out.append(f"{path.relative_to(REPO)}:{line}: {module} imports {name}, {why}")
    return out


def test_every_module_imports_only_its_layer_and_those_below():
    assert not _violations(), "\n".join(_violations())


@pytest.mark.parametrize("name, layer", [("neuron_explorer.common.errors", 0),
                                         ("neuron_explorer.nki.isa", 1),
                                         ("neuron_explorer.trace", 3),
                                         ("neuron_explorer.webapp.app", 4)])
def test_the_layers_are_read_from_the_names(name, layer):
    assert _target_layer(name) == layer
    assert name in {m for m, _, _ in _modules()}


def _private_imports() -> list[str]:
    """`from neuron_explorer.x import _name` anywhere in the package: what another module
    uses is that module's interface, named as such."""
    out = []
    for _, _, path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.startswith("neuron_explorer")):
                private = [a.name for a in node.names
                           if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    out.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.module} "
                               f"{', '.join(private)}")
    return out


def test_no_module_imports_another_modules_private_names():
    assert not _private_imports(), "\n".join(_private_imports())
