"""dane's Slurm launcher (`experiments.slurm_launcher`) under the name Hydra instantiates launchers from.

Hydra accepts only launcher classes whose module is under the ``hydra_plugins`` namespace
package; this one is found from the repository root (on ``sys.path`` under ``python -m``).
Configured by conf/hydra/launcher/slurm.yaml (``hydra/launcher=slurm``).
"""
try:
    import hydra_plugins.hydra_submitit_launcher  # noqa: F401
except ModuleNotFoundError:
    # Not installed (make setup installs it): Hydra imports every plugin at start-up and would warn on every
    # run; hydra/launcher=slurm itself then stops on its missing `submitit_slurm` default.
    pass
else:
    from dane.experiments import slurm_launcher

    class SlurmLauncher(slurm_launcher.SlurmLauncher):
        __doc__ = slurm_launcher.SlurmLauncher.__doc__
