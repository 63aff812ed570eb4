"""dane's Hydra launcher for Slurm (``hydra/launcher=slurm``, conf/hydra/launcher/slurm.yaml).

Hydra accepts launchers only from the ``hydra_plugins`` namespace package, so it lives here
rather than under experiments/.
"""
