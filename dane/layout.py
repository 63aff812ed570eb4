"""Where the package's parts lie: in a checkout beside ``dane/``, in an installed wheel inside it.

The repository keeps ``baselines/``, ``experiments/``, ``synthetic/``, ``paper_figs/`` and
``conf/`` at its root; a wheel maps them to ``dane/baselines`` ... ``dane/conf``
(pyproject.toml, ``[tool.setuptools.package-dir]``), so that ``dane`` and Hydra's
``hydra_plugins`` are its only top-level names.  Code imports them as ``dane.baselines``
etc. in both layouts: in a checkout the package root adds the checkout to its
``__path__`` (`dane/__init__.py`), so the same names resolve with only the repository on
``sys.path``, as the Makefile, the tests and the launchers run it.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Callable

#: the parts a wheel holds inside dane/ and a checkout beside it
MAPPED = ("baselines", "experiments", "synthetic", "paper_figs", "conf")

PACKAGE = Path(__file__).resolve().parent


def checkout() -> Path | None:
    """The repository root when this ``dane/`` is a checkout's (its parts beside it), else None."""
    root = PACKAGE.parent
    if (PACKAGE / "conf").is_dir() or not (root / "pyproject.toml").is_file():
        return None
    return root if all((root / part).is_dir() for part in MAPPED) else None


CHECKOUT = checkout()


def scripts_in(part: str) -> list[str]:
    """The modules of ``part`` (one of `MAPPED`) that run a command line (``if __name__ == "__main__":``), by name."""
    folder = (CHECKOUT or PACKAGE) / part
    return sorted(p.stem for p in folder.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


#: Hydra's config groups (conf/config.yaml, conf/simulate.yaml and their groups)
CONF_DIR = (CHECKOUT or PACKAGE) / "conf"


def lazy_names(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` (PEP 562) for names it exports without importing them: ``where[name]`` is the
    module that defines ``name`` (relative to ``package``, or absolute), imported when the name is first read and
    the name then kept in ``package``'s namespace; any other name is the usual AttributeError.  So that importing
    ``package`` costs nothing a caller does not use (`dane/__init__.py`: a launched worker's imports; `dane.comm`:
    the torch of the communicators, which ``--help`` does not need)."""
    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
