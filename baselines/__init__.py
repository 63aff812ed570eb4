"""The methods DANE is compared with, selected as ``algorithm=<name>``.

Each has a frozen config dataclass (a `dane.algorithm.AlgorithmConfig`, built by Hydra from
``conf/algorithm/<name>.yaml``, validated in ``__post_init__``, its ``algorithm`` the class it
builds) and a `dane.algorithm.Algorithm` whose round reads like its update rule and whose
class declares what it supports (elastic resets, asynchronous updates, client sampling) and
the columns it reports.  First-order and averaging baselines:

- ``admm``: consensus ADMM, scaled form (`ADMM`), one allreduce per round;
- ``gd``: distributed gradient descent with step 1/L_est (`GD`), one allreduce per round;
- ``osa``: one-shot averaging of the local optima (`OneShotAveraging`), one allreduce;
- ``local_sgd``: K local steps, then mean / shard-weighted mean / best election (`LocalSGD`);
- ``sync_sgd``: synchronous minibatch SGD (`SyncSGD`), one allreduce per minibatch step.

The Newton-type family (convex problems):

- ``inexact_dane``: DANE with an SVRG or CG local solve (`InexactDANE`), two allreduces;
- ``aide``: Catalyst acceleration around InexactDANE (`AIDE`), two allreduces;
- ``giant``: averaged local Newton-CG directions and a distributed line search (`GIANT`), three;
- ``disco``: damped Newton by distributed PCG (`DiSCO`), two per PCG step plus one.
"""
from .admm import ADMM, ADMMConfig, residual_balance
from .aide import AIDE, AIDEConfig
from .disco import DiSCO, DiSCOConfig, distributed_pcg
from .gd import GD, GDConfig
from .giant import GIANT, GIANTConfig
from .inexact_dane import InexactDANE, InexactDANEConfig
from .local_sgd import AGGREGATES, LocalSGD, LocalSGDConfig, local_steps
from .osa import OneShotAveraging, OSAConfig
from .spectral import lanczos_max_eig
from .sync_sgd import SyncSGD, SyncSGDConfig

__all__ = [
    "ADMM", "ADMMConfig", "AGGREGATES", "AIDE", "AIDEConfig", "DiSCO", "DiSCOConfig", "GD", "GDConfig", "GIANT",
    "GIANTConfig", "InexactDANE", "InexactDANEConfig", "LocalSGD", "LocalSGDConfig", "OSAConfig", "OneShotAveraging",
    "SyncSGD", "SyncSGDConfig", "distributed_pcg", "lanczos_max_eig", "local_steps", "residual_balance",
]

# The federated DANE line (docs/federated.md), with client sampling (dane.sampling); FedAvg is
# algorithm=fedavg (FedProx with mu = 0), the same iterates as local_sgd with a mean.
from .feddane import FedDANE, FedDANEConfig  # noqa: E402
from .fednl import FedNL, FedNLConfig  # noqa: E402
from .fedprox import FedProx, FedProxConfig  # noqa: E402
from .fedred import FedRed, FedRedConfig  # noqa: E402
from .scaffnew import Scaffnew, ScaffnewConfig  # noqa: E402
from .scaffold import Scaffold, ScaffoldConfig  # noqa: E402
from .sdane import SDANE, AccSDANE, AccSDANEConfig, SDANEConfig  # noqa: E402

__all__ += [
    "AccSDANE", "AccSDANEConfig", "FedDANE", "FedDANEConfig", "FedNL", "FedNLConfig", "FedProx", "FedProxConfig", "FedRed", "FedRedConfig",
    "SDANE", "SDANEConfig", "Scaffnew", "ScaffnewConfig", "Scaffold", "ScaffoldConfig",
]
