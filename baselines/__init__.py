"""The convex baselines DANE is compared with, selected as ``algorithm=<name>``.

Each has a frozen config dataclass (built by Hydra from ``conf/algorithm/<name>.yaml``,
validated in ``__post_init__``) and an `dane.algorithm.Algorithm` whose round reads
like its update rule:

- ``admm``: consensus ADMM, scaled form (`ADMM`), one allreduce per round;
- ``gd``: distributed gradient descent with step 1/L_est (`GD`), one allreduce per round;
- ``osa``: one-shot averaging of the local optima (`OneShotAveraging`), one allreduce;
- ``local_sgd``: K local steps, then mean / shard-weighted mean / best election (`LocalSGD`).
"""
from .admm import ADMM, ADMMConfig, residual_balance
from .gd import GD, GDConfig
from .local_sgd import AGGREGATES, LocalSGD, LocalSGDConfig, local_steps
from .osa import OneShotAveraging, OSAConfig
from .spectral import lanczos_max_eig

__all__ = [
    "ADMM", "ADMMConfig", "AGGREGATES", "GD", "GDConfig", "LocalSGD", "LocalSGDConfig", "OSAConfig",
    "OneShotAveraging", "lanczos_max_eig", "local_steps", "residual_balance",
]
