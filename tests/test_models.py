"""Model shapes, exact parameter counts (from the layer sizes by hand), seeding, and the factory."""

from __future__ import annotations

import pytest
import torch

from dane.errors import ConfigError
from dane.models import MLP, LeNet3, LeNet5, LogisticRegression, build_model


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_lenet5_has_61706_parameters():
    # conv 1->6 5x5: 156; conv 6->16 5x5: 2,416; fc 400->120: 48,120; 120->84: 10,164; 84->10: 850.
    assert count(LeNet5(in_channels=1, num_classes=10)) == 156 + 2416 + 48120 + 10164 + 850 == 61706


def test_lenet5_rgb_adds_only_first_conv_weights():
    assert count(LeNet5(in_channels=3, num_classes=10)) == 61706 + 2 * 6 * 5 * 5


def test_lenet3_parameter_count_and_layers():
    model = LeNet3(in_channels=1, num_classes=10)
    assert count(model) == 156 + 2416 + 400 * 10 + 10 == 6582
    learned = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(learned) == 3


@pytest.mark.parametrize("model_class", [LeNet3, LeNet5])
@pytest.mark.parametrize("in_channels", [1, 3])
def test_lenet_output_shape(model_class, in_channels):
    out = model_class(in_channels=in_channels, num_classes=7)(torch.zeros(4, in_channels, 32, 32))
    assert out.shape == (4, 7) and out.dtype == torch.float32


def test_mlp_and_logreg_shapes_and_counts():
    mlp = MLP(64, [32, 16], 10)
    assert count(mlp) == (64 * 32 + 32) + (32 * 16 + 16) + (16 * 10 + 10)
    assert mlp(torch.zeros(5, 64)).shape == (5, 10)
    logreg = LogisticRegression(3, 2)
    assert count(logreg) == 3 * 2 + 2
    assert logreg(torch.zeros(5, 3)).shape == (5, 2)
    # Images are flattened, so both run on MNIST-shaped input.
    assert MLP(32 * 32, [], 10)(torch.zeros(2, 1, 32, 32)).shape == (2, 10)


def test_logreg_is_affine():
    torch.manual_seed(0)
    model = LogisticRegression(4, 3)
    x, y = torch.randn(6, 4), torch.randn(6, 4)
    torch.testing.assert_close(model(x + y) - model(y), model(x) - model(torch.zeros(1, 4)))


@pytest.mark.parametrize("name", ["lenet3", "lenet5", "mlp", "logreg"])
def test_models_are_deterministic_given_manual_seed(name):
    in_shape = (1, 32, 32)
    torch.manual_seed(42)
    first = build_model(name, in_shape=in_shape, num_classes=10, hidden=[20])
    torch.manual_seed(42)
    second = build_model(name, in_shape=in_shape, num_classes=10, hidden=[20])
    torch.manual_seed(43)
    third = build_model(name, in_shape=in_shape, num_classes=10, hidden=[20])
    for a, b, c in zip(first.parameters(), second.parameters(), third.parameters()):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, c) for a, c in zip(first.parameters(), third.parameters()))


def test_build_model_dispatches_on_shape():
    assert count(build_model("lenet5", in_shape=(1, 32, 32), num_classes=10)) == 61706
    assert count(build_model("logreg", in_shape=(64,), num_classes=10)) == 650
    assert count(build_model("mlp", in_shape=(4,), num_classes=3, hidden=[5])) == 4 * 5 + 5 + 5 * 3 + 3


def test_build_model_errors_name_the_fix():
    with pytest.raises(ConfigError, match="unknown model 'resnet'; use one of: lenet3, lenet5, mlp, logreg"):
        build_model("resnet", in_shape=(64,), num_classes=10)
    with pytest.raises(ConfigError, match="needs C x 32 x 32 images, got in_shape \\(1, 28, 28\\)"):
        build_model("lenet5", in_shape=(1, 28, 28), num_classes=10)
    # docs/neural_networks.md's data@problem.data=digits under a LeNet problem: the fix digits_lenet5 uses
    with pytest.raises(ConfigError, match="got in_shape \\(64,\\); .* flat square features \\(digits\\) with "
                                          "problem.data.image_size=32, or model mlp/logreg"):
        build_model("lenet5", in_shape=(64,), num_classes=10)
    with pytest.raises(ConfigError, match="num_classes must be >= 2, got 1"):
        build_model("logreg", in_shape=(4,), num_classes=1)
    with pytest.raises(ConfigError, match="model.hidden must be >= 1, got 0"):
        build_model("mlp", in_shape=(4,), num_classes=3, hidden=[0])
