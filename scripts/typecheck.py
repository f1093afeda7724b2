"""Type-checks the `neuron_explorer` package with mypy, as it installs.

pyproject.toml maps `neuron_explorer` onto several top folders (explorer/, backend/,
collectors/, webapp/, workloads/, backend/nki), which mypy cannot follow by itself. This
builds the installed layout as a tree of links under build/typecheck/ (from the same
`package-dir` and `packages` settings setuptools reads), runs mypy on it with the settings
in pyproject.toml's [tool.mypy], and reports errors at the files' real paths.

    .venv/bin/python scripts/typecheck.py [extra mypy arguments]
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"


def _folder_of(package: str, package_dir: dict[str, str]) -> Path:
    """The source folder of `package`: its own mapping, or its nearest mapped parent's."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        mapped = package_dir.get(".".join(parts[:n]))
        if mapped is not None:
            return ROOT / mapped / Path(*parts[n:])
    return ROOT / Path(*parts)


def build_tree() -> dict[str, str]:
    """Links every module of every listed package into TREE; returns {link: real path}."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shutil.rmtree(TREE, ignore_errors=True)
    real_of: dict[str, str] = {}
    for package in settings["packages"]:
        source = _folder_of(package, settings.get("package-dir", {}))
        target = TREE / Path(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for module in sorted(source.glob("*.py")):
            link = target / module.name
            link.symlink_to(module)
            real_of[str(link.relative_to(ROOT))] = str(module.relative_to(ROOT))
    return real_of


def main(argv: list[str]) -> int:
    from mypy import api

    real_of = build_tree()
    os.chdir(ROOT)
    out, err, status = api.run(["--config-file", "pyproject.toml",
                                "--cache-dir", str(TREE.parent / "mypy_cache"),
                                str(TREE.relative_to(ROOT) / "neuron_explorer"), *argv])
    for line in out.splitlines():
        path, sep, rest = line.partition(":")
        print(f"{real_of.get(path, path)}{sep}{rest}")
    sys.stderr.write(err)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
