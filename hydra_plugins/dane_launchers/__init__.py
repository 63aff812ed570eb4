"""The dane sweep launchers (`experiments.launchers`) under the name Hydra instantiates launchers from.

Hydra (hydra/core/plugins.py) scans the ``hydra_plugins`` namespace package and accepts
only classes whose module is under it: these subclasses are the launchers, by that name.
It is found from the repository root (on ``sys.path`` under ``python -m``) and, after
``pip install -e .``, from anywhere (pyproject.toml, packages.find).
"""
from dane.experiments import launchers


class HorovodLauncher(launchers.HorovodLauncher):
    __doc__ = launchers.HorovodLauncher.__doc__


class TorchrunLauncher(launchers.TorchrunLauncher):
    __doc__ = launchers.TorchrunLauncher.__doc__
