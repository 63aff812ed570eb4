"""The models DANE is run on: LeNet-3, LeNet-5, an MLP and multinomial logistic regression.

All take a batch ``x`` and return unnormalized class scores (logits) of shape
``(batch, num_classes)``; the loss applies the softmax. Parameters are initialized by
PyTorch's default initializers from the global generator, so ``torch.manual_seed(s)``
before construction fixes them and a run is reproducible from its seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

from dane.errors import ConfigError

MODEL_NAMES = ("lenet3", "lenet5", "mlp", "logreg")


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"model.{name} must be >= 1, got {value}")


def _check_classes(num_classes: int) -> None:
    if num_classes < 2:
        raise ConfigError(f"num_classes must be >= 2, got {num_classes}")


def _lenet_features(in_channels: int) -> nn.Sequential:
    """The two conv/pool stages shared by LeNet-3 and LeNet-5: 32x32 in, 16x5x5 out."""
    _check_positive("in_channels", in_channels)
    return nn.Sequential(
        nn.Conv2d(in_channels, 6, kernel_size=5),  # 32 -> 28
        nn.ReLU(),
        nn.MaxPool2d(2),  # 28 -> 14
        nn.Conv2d(6, 16, kernel_size=5),  # 14 -> 10
        nn.ReLU(),
        nn.MaxPool2d(2),  # 10 -> 5
        nn.Flatten(),
    )


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al., 1998): conv(6,5)-pool-conv(16,5)-pool-fc120-fc84-fc.

    Modernized as is usual: ReLU instead of scaled tanh, max-pool instead of trainable
    subsampling, full C3 connectivity and a linear output instead of RBF units. On a
    1 x 32 x 32 input with 10 classes it has 61,706 parameters.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        _check_classes(num_classes)
        self.features = _lenet_features(in_channels)
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


class LeNet3(nn.Module):
    """A LeNet with three learned layers: conv(6,5)-pool-conv(16,5)-pool-fc(num_classes).

    "LeNet-3" in the source paper names a LeNet with three learned layers but gives no
    layer sizes. We keep LeNet-5's two conv stages and replace its three fully
    connected layers by one, so the two models differ only in depth of the classifier.
    On a 1 x 32 x 32 input with 10 classes it has 6,582 parameters.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        _check_classes(num_classes)
        self.features = _lenet_features(in_channels)
        self.classifier = nn.Linear(16 * 5 * 5, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


class MLP(nn.Module):
    """Fully connected ReLU network; the input is flattened, so images work too."""

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int) -> None:
        super().__init__()
        _check_positive("in_features", in_features)
        _check_classes(num_classes)
        for width in hidden:
            _check_positive("hidden", width)
        widths = [in_features, *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for width_in, width_out in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: one ``Linear`` layer; with cross-entropy, a convex loss.

    For two classes this has two score columns rather than one; the softmax of two
    scores is the sigmoid of their difference, so the model family is the same.
    """

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        _check_positive("in_features", in_features)
        _check_classes(num_classes)
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.flatten(x))


def build_model(
    name: str, *, in_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (100,)
) -> nn.Module:
    """Construct model ``name`` for examples of shape ``in_shape`` (e.g. ``Dataset.in_shape``).

    ``hidden`` is used by ``mlp`` only. LeNets need ``in_shape == (C, 32, 32)``.
    """
    in_shape = tuple(in_shape)
    if name in ("lenet3", "lenet5"):
        if len(in_shape) != 3 or in_shape[1:] != (32, 32):
            raise ConfigError(
                f"model {name} needs C x 32 x 32 images, got in_shape {in_shape}; "
                "use mnist with pad_to_32=true or cifar10, flat square features (digits) with "
                "problem.data.image_size=32, or model mlp/logreg for flat features"
            )
        model_class = LeNet3 if name == "lenet3" else LeNet5
        return model_class(in_channels=in_shape[0], num_classes=num_classes)
    in_features = math.prod(in_shape)
    if name == "mlp":
        return MLP(in_features, list(hidden), num_classes)
    if name == "logreg":
        return LogisticRegression(in_features, num_classes)
    raise ConfigError(f"unknown model '{name}'; use one of: {', '.join(MODEL_NAMES)}")
