"""The workload (peer_common) as a pfl simulation: pfl's FederatedAveraging on its SimulatedBackend, a PyTorch model
whose loss is client i's O_i, K local epochs of one full batch with torch.optim.SGD, a central SGD of step 1.

    python scripts/peers/pfl_fedavg.py --shards F.npz --per-round S --lr LR [--rounds 30 --local-steps 10 ...]

The rows and the model are float64 (the rows handed to pfl as float64 tensors: its own conversion is to float32), but
pfl keeps a model difference in float32 (`PyTorchModel.get_model_difference`), so its iterates carry float32
round-off.  Every user weighs 1 in pfl's average, the plain mean.  Clients a round: all m by pfl's
``minimize_reuse`` sampler (each user once), else S by its ``random`` sampler (with replacement, numpy's global
generator, seeded); a round's seconds are the times between pfl's ``after_central_iteration`` callbacks.
"""
from __future__ import annotations

import time
from importlib.metadata import version

import numpy as np
import torch
from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics
from pfl.model.pytorch import PyTorchModel

from peer_common import answer, arguments, clients


class Logistic(torch.nn.Module):
    """w, and a client's O_i(w) = weight Σ f_j(w) + (λ/2)‖w‖² as pfl's ``loss``."""

    def __init__(self, dim: int, weight: float, lam: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(dim, dtype=torch.float64))
        self.weight, self.lam = weight, lam

    def loss(self, X, y, eval=False):  # noqa: A002 -- pfl's keyword
        z = X @ self.w
        return self.weight * (torch.nn.functional.softplus(z) - y * z).sum() + 0.5 * self.lam * (self.w @ self.w)

    def metrics(self, X, y, eval=False):  # noqa: A002 -- pfl evaluates at its round 0: nothing to measure here
        return {}


class Stamps(TrainingProcessCallback):
    def __init__(self):
        self.stamps = []

    def on_train_begin(self, *, model):
        self.stamps.append(time.perf_counter())
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        self.stamps.append(time.perf_counter())
        return False, Metrics()


def main() -> None:
    args = arguments(__doc__)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    parts, X, y = clients(args.shards)
    m = len(parts)
    data = {i: Dataset([torch.from_numpy(Xi), torch.from_numpy(yi)], user_id=i) for i, (Xi, yi) in enumerate(parts)}
    sampler = get_user_sampler("minimize_reuse" if args.per_round >= m else "random", list(range(m)))
    module = Logistic(X.shape[1], m / len(y), args.lam)
    model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    stamps = Stamps()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=args.rounds, evaluation_frequency=args.rounds + 1,
                                           train_cohort_size=min(args.per_round, m), val_cohort_size=None),
        backend=SimulatedBackend(training_data=FederatedDataset(data.__getitem__, sampler), val_data=None),
        model=model, model_train_params=NNTrainHyperParams(local_learning_rate=args.lr,
                                                           local_num_epochs=args.local_steps, local_batch_size=None),
        model_eval_params=NNEvalHyperParams(local_batch_size=None), callbacks=[stamps])
    answer("pfl", version("pfl"), stamps.stamps, module.w.detach().numpy(), X, y, args.lam, torch=torch.__version__)


if __name__ == "__main__":
    main()
