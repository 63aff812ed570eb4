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
from .disco import DiSCO, DiSCOConfig, distributed_pcg  # noqa: E402  (Newton-type: distributed PCG, damped step)
from .giant import GIANT, GIANTConfig  # noqa: E402  (Newton-type: averaged local Newton directions, line search)

__all__ += ["DiSCO", "DiSCOConfig", "GIANT", "GIANTConfig", "distributed_pcg"]
from .aide import AIDE, AIDEConfig  # noqa: E402  (Catalyst acceleration around InexactDANE)
from .inexact_dane import InexactDANE, InexactDANEConfig  # noqa: E402  (DANE with an SVRG or CG local solve)

__all__ += ["AIDE", "AIDEConfig", "InexactDANE", "InexactDANEConfig"]
