r"""Real-time augmentation of image minibatches (``problem.augment=true``), as the MPI master/worker source did.

Each training image gets its own random shift of up to `MAX_SHIFT` pixels along each
axis and a rotation by up to `MAX_DEGREES` degrees about its centre, as one affine map

.. math:: \begin{pmatrix} x' \\ y' \end{pmatrix} = R(\theta) \begin{pmatrix} x \\ y \end{pmatrix}
          + \frac{2}{(W, H)} \begin{pmatrix} s_x \\ s_y \end{pmatrix}

in normalized coordinates, sampled bilinearly (``torch.nn.functional.affine_grid`` and
``grid_sample``, zeros outside).  The angles and shifts come from the worker's own
`torch.Generator` (seeded by (seed, worker)), so a run is reproducible and its workers
see different transforms.  Only training minibatches are augmented, never the gradient
or metrics a round is evaluated on.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

MAX_SHIFT = 2.0     # pixels
MAX_DEGREES = 10.0


def augment(x: torch.Tensor, generator: torch.Generator, max_shift: float = MAX_SHIFT,
            max_degrees: float = MAX_DEGREES) -> torch.Tensor:
    """``x`` (batch, C, H, W), each image shifted and rotated by its own draw from ``generator``."""
    b, _, h, w = x.shape
    draws = torch.rand(b, 3, generator=generator, dtype=torch.float64) * 2 - 1  # uniform on [-1, 1]
    angle = draws[:, 0] * math.radians(max_degrees)
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack([torch.stack([cos, -sin, draws[:, 1] * max_shift * 2 / w], 1),
                         torch.stack([sin, cos, draws[:, 2] * max_shift * 2 / h], 1)], 1)
    grid = F.affine_grid(theta.to(x.device, x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
