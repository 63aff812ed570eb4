"""problem.augment (dane.data.augment): what a worker's training minibatches look like."""
from __future__ import annotations

import math

import pytest
import torch

from dane.data.augment import MAX_SHIFT, augment
from dane.errors import ConfigError
from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig


def centroid(img: torch.Tensor) -> torch.Tensor:
    h, w = img.shape
    ys, xs = torch.meshgrid(torch.arange(h, dtype=img.dtype), torch.arange(w, dtype=img.dtype), indexing="ij")
    return torch.stack([(xs * img).sum(), (ys * img).sum()]) / img.sum()


def test_a_shift_moves_each_image_by_its_own_draw():
    """Without rotation an image's mass moves by minus its drawn shift (x' = x + s samples from s ahead),
    the draws being the generator's: another generator with the same seed reproduces them."""
    x = torch.zeros(4, 1, 16, 16, dtype=torch.float64)
    x[:, 0, 6:10, 6:10] = 1.0
    out = augment(x, torch.Generator().manual_seed(5), max_degrees=0)
    draws = torch.rand(4, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2 - 1
    for k in range(4):
        moved = centroid(out[k, 0]) - centroid(x[k, 0])
        assert torch.allclose(moved, -MAX_SHIFT * draws[k, 1:], atol=1e-9)
        assert out[k, 0].sum() == pytest.approx(16.0, abs=1e-9)  # the square stays inside: nothing lost
    assert torch.equal(out, augment(x, torch.Generator().manual_seed(5), max_degrees=0))


def test_a_rotation_keeps_the_centre_and_turns_the_image():
    x = torch.zeros(1, 1, 33, 33, dtype=torch.float64)
    x[0, 0, 16, 16:30] = 1.0                                     # a bar from the centre to the right
    out = augment(x, torch.Generator().manual_seed(1), max_shift=0, max_degrees=90)
    angle = (torch.rand(1, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)[0, 0] * 2 - 1) * math.pi / 2
    moved = centroid(out[0, 0]) - 16
    # bilinear resampling blurs the bar but keeps its centroid's direction to 1e-3 rad (a 0.0175 rad/degree constant
    # is 4e-3 off at this 79° draw) and its distance from the centre, 6.5 = mean(0..13), to 0.05 (mismatched
    # align_corners in affine_grid and grid_sample rotates about another centre: 6.29)
    assert math.atan2(float(moved[1]), float(moved[0])) == pytest.approx(-float(angle), abs=1e-3)
    assert float(moved.norm()) == pytest.approx(6.5, abs=0.05)


def test_workers_see_their_own_augmented_rows_only_in_training_steps():
    # digits as 1 x 8 x 8 images and a small MLP (it flattens them): images, but cheap
    config = NeuralProblemConfig(data=DataConfig(dataset="digits", image_size=8), model=ModelConfig(name="mlp", hidden=(16,)),
                                 augment=True, device="cpu", dtype="float64", seed=0, inner_batch_size=16)
    plain = NeuralProblemConfig(data=config.data, model=config.model, device="cpu", dtype="float64", seed=0,
                                inner_batch_size=16)
    a0, a1, p0 = config.build(0, 2), config.build(1, 2), plain.build(0, 2)
    w = p0.initial_point()
    assert torch.equal(a0.evaluate(w)[1], p0.evaluate(w)[1]) and torch.equal(a0.evaluate(w)[0], p0.evaluate(w)[0])
    idx = torch.arange(16)
    assert not torch.allclose(a0.batch_grad(w, idx), p0.batch_grad(w, idx))   # the training step sees moved images
    assert not torch.equal(a0.augmenter.get_state(), a1.augmenter.get_state())  # each worker its own draws
    state = a0.state_dict()
    g = a0.batch_grad(w, idx)
    a0.load_state_dict(state)
    assert torch.equal(a0.batch_grad(w, idx), g)                              # checkpointed with the problem
    with pytest.raises(ConfigError, match="problem.augment"):
        NeuralProblemConfig(data=DataConfig(dataset="digits"), model=ModelConfig(name="mlp"), augment=True,
                            device="cpu").build(0, 1)
