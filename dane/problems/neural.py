r"""Worker i's shard of a classification data set and a torch model, as a `Problem` on a flat vector.

The model's parameters are one flat vector w (``parameters_to_vector``); algorithms see
only w, the communicator averages it, and the model is loaded from it once per call.
Worker i holds the n_i training rows S_i of N and

.. math:: O_i(w) = \frac{m\,n_i}{N}\,\frac1{n_i}\sum_{j\in S_i} \mathrm{CE}(f_w(x_j), y_j)
                  + \frac{l_2}{2}\|w\|^2,

so that the mean of the O_i is exactly the global training loss
:math:`\frac1N\sum_j \mathrm{CE}_j + \frac{l_2}{2}\|w\|^2` even for unequal (Dirichlet)
shards; for equal shards the weight m n_i / N is 1.

`evaluate(w)` returns ∇O_i(w) (over the whole shard, or estimated on ``grad_batches``
minibatches) and the metric vector ``(objective, test_loss, test_accuracy)``.  The test
set is cut into m contiguous slices; worker i evaluates only slice i and contributes
``m/N_test`` times its sums, so the allreduced means are exactly the global test loss and
accuracy (no test row is counted twice, and the evaluation work is split m ways).

`prox_solve(anchor, linear, mu)` is inexact: ``inner_steps`` steps of an inner torch
optimizer on the subproblem gradient ∇loss_batch(w) − linear + μ(w − anchor) (see
`dane.numerics.inner`).  Model and data live on ``device`` (CUDA, pinned by local rank, when
available); the flat vectors exchanged with the algorithm stay on the CPU.

`NeuralProblem.convex` is true only for the ``logreg`` model (cross-entropy of a linear
model); every network is non-convex, and DANE's safeguard (`dane.safeguard.MuSafeguard`)
then runs its non-convex rule.  It compares the exact global training loss of
successive averaged iterates (the full-shard objective rides in the gradient
allreduce) and rejects an iterate whose loss exceeds 1.25 times the lowest accepted
one (or is nan/inf): it returns to the last accepted iterate and redoes the local solve
with a larger μ.  μ tracks the measured spread of the local curvatures along the step,
and, unlike on a convex problem, comes back down: the remembered spread is halved
before each new measurement is folded in, and the rejection boost halves after every
accepted round.  That is a trust region on
the averaged step that keeps the training loss within 1.25 times its best; it does not
make the problem convex.  The convex rule (reject any rise, μ never decreasing)
stalls on a network: one early rejection raises μ for good, and the local solves then
barely move.  ``tests/test_neural.py`` measures the non-convex rule: where plain DANE
converges it keeps plain DANE's accuracy, and after rejections μ comes back down.  The table
experiments (conf/experiment/table_*.yaml) still run plain DANE
(``algorithm.safeguard=false``, μ=0), the paper's setting.  The inner SGD takes the μ
term implicitly (`dane.numerics.inner.proximal_step`), so a large μ keeps the local solve near
w_t instead of making it diverge.

The configs (`NeuralProblemConfig` and its parts) are here; the shard itself, `NeuralProblem`, is
`dane.problems.neural_shard` (also imported from here).
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator

import torch

from .. import checks
from ..data import DATASET_NAMES, Dataset, load_dataset, shard_indices
from ..data.overlap import check_factors, describe, overlap_shards
from ..data.registry import dataset_stamp
from ..data.sharding import ShardingKeys
from ..errors import ConfigError
from ..numerics.inner import InnerSolver
from ..seeds import STREAMS, worker_seed
from ..models import MODEL_NAMES, build_model
from .base import ProblemConfig
from .neural_shard import NeuralProblem
from .stacked_net import StackedNeuralProblem

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
SAMPLER_STREAM = STREAMS["network_minibatch"].number  # the problem's minibatch generator
AUGMENT_STREAM = STREAMS["augmentation"].number  # the augmentation generator (problem.augment)
#: torch intra-op threads of every worker of a network run: every rank of a launched run, and
#: each simulated worker (`dane.comm.ThreadGroup` holds each of its threads to one as well)
INTRA_OP_THREADS = 1


@contextmanager
def reproducible_numerics(threads: int = INTRA_OP_THREADS) -> Iterator[None]:
    """Fix the process-wide torch settings that the bits of a network run depend on; restore them on exit.

    - ``threads`` intra-op threads.  oneDNN's convolution backward and MKL's sgemm split
      their reductions (over the batch, over the inner dimension) among the threads, so
      the rounding of a float32 gradient depends on the thread count.  Left alone, that
      count comes from the environment: OMP_NUM_THREADS, which torchrun sets to 1 and
      horovodrun leaves unset, and otherwise the number of usable cores (HorovodOptions
      gives each rank its share).  One thread is the count every machine has and the one
      the simulator gives each worker (one core each), so a run's records depend on its
      config and seed only, and a launched run equals the simulated one.
    - ``torch.use_deterministic_algorithms(True, warn_only=True)`` and no cuDNN
      benchmarking: on CUDA, cuDNN and cuBLAS then use deterministic kernels
      (cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG``, set here unless the environment has it).
      ``warn_only``: an op with no deterministic kernel on the run's device (on CUDA,
      e.g. some pooling and loss backward passes) warns instead of stopping the run;
      such a run is reproducible only up to that op.  On the CPU every op these models
      use is deterministic at a fixed thread count.

    Bit-for-bit equality holds for the same torch build on the same kind of CPU: oneDNN
    and MKL pick their kernels by instruction set.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS makes its first handle
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])
        torch.backends.cudnn.benchmark = saved[3]


@dataclass(frozen=True)
class DataConfig(ShardingKeys):
    """Which data set, where it is, and how its training rows are divided (conf/data/; the sharding keys
    are `dane.data.sharding.ShardingKeys`)."""

    dataset: str = "digits"
    data_dir: str | None = None
    test_fraction: float = 0.2
    pad_to_32: bool = True
    image_size: int | None = None  # flat square features -> 1 x S x S images (see `as_images`)
    overlap: bool = False   # grow each shard by random blocks of load_factor x N rows to absolute_factor x N
    load_factor: float = 0.1
    absolute_factor: float = 0.5

    def __post_init__(self) -> None:
        self.check_sharding("problem.data")
        checks.boolean("problem.data.overlap", self.overlap)
        check_factors(self.load_factor, self.absolute_factor)
        if self.image_size is not None:
            checks.positive_int("problem.data.image_size", self.image_size)


@dataclass(frozen=True)
class ModelConfig:
    """Which network (conf/model/); ``hidden`` is used by the MLP only."""

    name: str = "mlp"
    hidden: tuple[int, ...] = (100,)

    def __post_init__(self) -> None:
        checks.one_of("problem.model.name", self.name, MODEL_NAMES)
        object.__setattr__(self, "hidden", layer_widths(self.hidden))


def layer_widths(hidden) -> tuple[int, ...]:
    """``problem.model.hidden`` as a tuple of positive integers, or one line naming the key and the fix."""
    widths = None if isinstance(hidden, (str, bytes)) or not hasattr(hidden, "__iter__") else list(hidden)
    if widths is None or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in widths):
        raise ConfigError(f"problem.model.hidden must be a list of layer widths (positive integers) like [100] or "
                          f"[256,128], or [] for none, got {hidden if widths is None else widths!r}")
    return tuple(widths)


def check_network_data(data) -> None:
    """A network reads a data set by name (`DataConfig`) or a store's samples by id (``data@problem.data=mongo``); a
    table source (`dane.ArraySource`, ``data=csv|libsvm|npz``, a function of one's own) serves the convex problems
    only, or one line naming the key and what a network takes."""
    if isinstance(data, DataConfig) or getattr(data, "by_id", False):
        return
    given = f"{type(data).__name__} {getattr(data, 'name', '')!r}".replace(" ''", "")
    raise ConfigError(f"problem.data is a table source ({given}), which only problem=ridge|logreg|softmax take, as "
                      f"data=; a network takes problem.data.dataset={'|'.join(DATASET_NAMES)} or "
                      f"data@problem.data=mongo")


@dataclass(frozen=True)
class NeuralProblemConfig(ProblemConfig):
    """A classification problem: data + model + loss weight decay + the inner solver."""

    compute_bound = True  # rounds of seconds of compute: Horovod's background loop may wake less often (HorovodOptions)

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    l2: float = 0.0
    inner_optimizer: str = "sgd"
    inner_lr: float = 0.05
    inner_steps: int | None = 50      # null: one pass over the local shard per solve
    inner_batch_size: int | None = 100
    inner_momentum: float = 0.0
    grad_batches: int | None = None   # null: exact full-shard gradient
    eval_batch_size: int = 1000
    augment: bool = False             # random shifts and small rotations of training minibatches (images only)
    device: str = "auto"
    dtype: str | None = "float32"    # null: the run's top-level dtype
    seed: int = 0
    name: str = "neural"

    def __post_init__(self) -> None:
        check_network_data(self.data)
        checks.nonnegative("problem.l2", self.l2)
        if self.grad_batches is not None:
            checks.positive_int("problem.grad_batches", self.grad_batches)
        checks.positive_int("problem.eval_batch_size", self.eval_batch_size)
        checks.boolean("problem.augment", self.augment)
        checks.one_of("problem.device", self.device, DEVICES)
        if self.dtype is not None:
            checks.one_of("problem.dtype", self.dtype, tuple(DTYPES))
        self.inner  # validates the inner-solver keys now, before any process group starts

    @property
    def inner(self) -> InnerSolver:
        return InnerSolver(optimizer=self.inner_optimizer, lr=self.inner_lr, steps=self.inner_steps,
                           batch_size=self.inner_batch_size, momentum=self.inner_momentum)

    @property
    def by_id(self) -> bool:
        """Whether the workers read a store's images by id (``data@problem.data=mongo``: `dane.data.mongo_source`)."""
        return getattr(self.data, "by_id", False)

    def dataset(self) -> Dataset:
        d = self.data
        if getattr(d, "by_id", False):  # data@problem.data=mongo: labels now, each worker's images by id
            return _store_dataset(d, self.seed)
        return _load(d.dataset, d.data_dir, self.seed, d.test_fraction, d.pad_to_32, d.image_size,
                     dataset_stamp(d.dataset, d.data_dir))

    def prepare(self) -> None:
        """Load the shared data set (cached), so that a worker's timed setup is only its own shard and model."""
        self.dataset()

    def numerics(self):
        """The torch settings a run of this problem holds for its whole length (`reproducible_numerics`)."""
        return reproducible_numerics()

    def check_workers(self, workers: int) -> None:
        """Loads the data (cached) so that a missing file or too many workers fail before any process group."""
        data = self.dataset()
        if workers > len(data.test_y):
            raise ConfigError(f"workers={workers} exceeds the {len(data.test_y)} test rows of {data.name}; use fewer workers")
        shard_indices(data.train_y, workers, seed=self.seed, **self.data.scheme_options())
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("problem.device=cuda but torch sees no CUDA device; use problem.device=auto or cpu")

    def shards(self, data: Dataset, size: int) -> tuple[list[torch.Tensor], list[str]]:
        """Every worker's training rows, and the note that ``data.overlap`` logs."""
        d = self.data
        shards = shard_indices(data.train_y, size, seed=self.seed, **d.scheme_options())
        if not d.overlap:
            return shards, []
        n = len(data.train_y)
        shards = overlap_shards(shards, n, load_factor=d.load_factor, absolute_factor=d.absolute_factor, seed=self.seed)
        return shards, [describe(shards, n, d.load_factor, d.absolute_factor)]

    def stacked_form(self, size: int) -> str | None:
        """None where the ``size`` workers can run as one `StackedNeuralProblem` (equal shards, SGD local solves,
        no augmentation); else why not, as a clause (`dane.loop.batching`)."""
        if self.augment:
            return "problem.augment=true draws each worker's shifts and rotations from its own generator"
        if self.inner_optimizer != "sgd":
            return f"problem.inner_optimizer={self.inner_optimizer} has no stacked form (sgd has)"
        sizes = {len(shard) for shard in self.shards(self.dataset(), size)[0]}
        if len(sizes) > 1:
            return (f"the {size} workers' shards of {self.dataset().name} differ in size ({min(sizes)} to "
                    f"{max(sizes)} rows); a stacked network needs equal shards (workers dividing the training rows, "
                    "iid sharding, no overlap)")
        return None

    def batched_by_default(self, size: int) -> bool:
        """``sim.batched=auto`` stacks a network on a GPU, where m simulated workers otherwise take turns
        (`dane.comm.threads.DeviceTurns`).  On the CPU the stacked problem runs the per-worker kernels one worker
        after another (`dane.problems.stacked_net`: the workers share no weights, so stacking saves no arithmetic,
        and grouped convolutions are slower), in one thread where the per-worker path's threads share the
        cores: no faster (``make bench``: ``batched_net``, scripts/bench_batched_net.py, and its ``roofline``),
        so auto keeps one thread per worker there; ``sim.batched=true`` stacks anyway (no m threads)."""
        return pick_device(self.device, 0).type == "cuda"

    def initial_model(self, data):
        """The model every worker starts from: built under ``problem.seed``, the global generator left as it was."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return build_model(self.model.name, in_shape=data.in_shape, num_classes=data.num_classes,
                               hidden=self.model.hidden)

    def build_stacked(self, size: int, dtype: torch.dtype = torch.float32) -> "StackedNeuralProblem":
        """The ``size`` shards of `build`, row for row, as one `dane.problems.stacked_net.StackedNeuralProblem`."""
        data = self.dataset()
        dtype = DTYPES[self.dtype] if self.dtype is not None else dtype
        shards, overlap_notes = self.shards(data, size)
        model = self.initial_model(data)  # the one every worker of `build` starts from
        rows = torch.stack(shards)
        total = sum(len(s) for s in shards)
        problem = StackedNeuralProblem(
            model, data.train_x[rows], data.train_y[rows], data.test_x, data.test_y,
            torch.tensor_split(torch.arange(len(data.test_y)), size), weight=size * len(shards[0]) / total,
            test_weight=size / len(data.test_y), num_classes=data.num_classes, l2=self.l2, inner=self.inner,
            grad_batches=self.grad_batches, eval_batch_size=self.eval_batch_size, device=pick_device(self.device, 0),
            dtype=dtype, sampler_seeds=[worker_seed(self.seed, rank, SAMPLER_STREAM) for rank in range(size)],
            notes=[*data.notes, *overlap_notes])
        problem.data_info = data.info()
        return problem

    def build(self, rank: int, size: int, dtype: torch.dtype = torch.float32) -> "NeuralProblem":
        data = self.dataset()
        dtype = DTYPES[self.dtype] if self.dtype is not None else dtype
        shards, overlap_notes = self.shards(data, size)
        shard = shards[rank]
        if self.augment and len(data.in_shape) != 3:
            raise ConfigError(f"problem.augment=true shifts and rotates images, but {data.name} has flat features "
                              f"{tuple(data.in_shape)}; set problem.data.image_size, use an image data set, or "
                              "problem.augment=false")
        test_rows = torch.tensor_split(torch.arange(len(data.test_y)), size)[rank]
        model = self.initial_model(data)
        problem = NeuralProblem(
            model, data.train_x[shard], data.train_y[shard], data.test_x[test_rows], data.test_y[test_rows],
            # m n_i / Σ_j n_j (Σ_j n_j = N without overlap): the mean of the O_i is the mean loss over the rows held
            weight=size * len(shard) / sum(len(s) for s in shards), test_weight=size / len(data.test_y),
            num_classes=data.num_classes, workers=size, l2=self.l2, inner=self.inner, grad_batches=self.grad_batches,
            eval_batch_size=self.eval_batch_size, device=pick_device(self.device, rank), dtype=dtype,
            sampler_seed=worker_seed(self.seed, rank, SAMPLER_STREAM), notes=[*data.notes, *overlap_notes],
            augment_seed=worker_seed(self.seed, rank, AUGMENT_STREAM) if self.augment else None,
        )
        problem.solver_notes.worker = rank  # whose rows its inner nulls read
        problem.data_info = data.info()  # into the run's summary: what the numbers were measured on
        if self.by_id:  # the workers of a launched run check that they read one push (dane.loop.worker.check_one_push)
            problem.data_push = self.data.pushed(data.train_x.push_id)
        return problem


@lru_cache(maxsize=4)
def _store_dataset(source, seed: int) -> Dataset:
    from ..data.mongo_source import image_dataset

    return image_dataset(source, seed)


@lru_cache(maxsize=4)
def _load(dataset: str, data_dir: str | None, seed: int, test_fraction: float, pad_to_32: bool,
          image_size: int | None, stamp: tuple | None) -> Dataset:
    """`load_dataset`, kept per process by its arguments and ``stamp`` (`dane.data.registry.dataset_stamp`: the files
    read, so that files rewritten since are read again)."""
    data = load_dataset(dataset, data_dir=data_dir, seed=seed, test_fraction=test_fraction, pad_to_32=pad_to_32,
                        key="problem.data.test_fraction")
    return data if image_size is None else as_images(data, image_size)


def as_images(data: Dataset, size: int) -> Dataset:
    """Flat k*k features as 1 x size x size images, each pixel repeated size/k times per axis (nearest).

    This is how scikit-learn's 8 x 8 digits feed LeNet's 32 x 32 input: 4 x 4 blocks keep
    the digit filling the frame, as an MNIST digit does, where zero-padding would leave
    the 5 x 5 filters of the first layer looking mostly at the border.
    """
    side = math.isqrt(data.in_shape[-1]) if len(data.in_shape) == 1 else 0
    if side * side != math.prod(data.in_shape) or size % side:
        raise ConfigError(f"problem.data.image_size={size} needs flat square features whose side divides it; "
                          f"{data.name} has shape {data.in_shape}; set problem.data.image_size=null")

    def grow(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1, 1, side, side).repeat_interleave(size // side, 2).repeat_interleave(size // side, 3).contiguous()

    return Dataset(grow(data.train_x), data.train_y, grow(data.test_x), data.test_y, data.num_classes, data.name,
                   [*data.notes, f"{data.name}: {side}x{side} features upsampled (nearest) to 1x{size}x{size} images"],
                   data.split)


def pick_device(device: str, rank: int) -> torch.device:
    """``cuda:<local rank mod GPUs>`` when CUDA is wanted and present, else the CPU."""
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    local = int(os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("LOCAL_RANK", rank)))
    return torch.device("cuda", local % torch.cuda.device_count())
