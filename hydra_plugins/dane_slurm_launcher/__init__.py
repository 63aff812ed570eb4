"""dane's Slurm launcher (`experiments.slurm_launcher`) under the name Hydra instantiates launchers from.

Hydra accepts only launcher classes whose module is under the ``hydra_plugins`` namespace
package; this one is found from the repository root (on ``sys.path`` under ``python -m``).
Configured by conf/hydra/launcher/slurm.yaml (``hydra/launcher=slurm``).
"""
from experiments import slurm_launcher


class SlurmLauncher(slurm_launcher.SlurmLauncher):
    __doc__ = slurm_launcher.SlurmLauncher.__doc__
