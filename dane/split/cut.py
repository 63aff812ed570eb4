"""Cutting one network in two (or three, U-shaped) at a named module.

A model's *leaves* (modules without children, in registration order) are, for every
network of `dane.models`, the order of its forward pass: ``f = leaf_k ∘ ... ∘ leaf_1``.
A cut at leaf ``name`` makes

    bottom = leaves up to and including ``name``          (the agent's part)
    top    = the leaves after it                          (the server's part)

and, U-shaped, the top splits again before its last learned leaf:
``middle`` (the server's) and ``head`` (the agent's last layer, with the loss).  A cut
is valid when every part has parameters; `cut_choices` lists the valid names with the
bottom's share of the parameters, which is what a bad cut's one-line error shows.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import nn

from ..errors import ConfigError


@dataclass
class Parts:
    """The pieces of one cut model; ``head`` is None unless U-shaped."""

    bottom: nn.Sequential
    top: nn.Sequential
    head: nn.Sequential | None = None


def leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, module) for name, module in model.named_modules() if name and not list(module.children())]


def _count(modules) -> int:
    return sum(p.numel() for _, m in modules for p in m.parameters())


def _head_start(items: list[tuple[str, nn.Module]]) -> int:
    """Index of the last leaf with parameters: the U-shaped head starts there."""
    return max(i for i, (_, m) in enumerate(items) if _count([(None, m)]))


def cut_choices(model: nn.Module, u_shaped: bool = False) -> list[tuple[str, float]]:
    """The valid cut names and the bottom's share of the model's parameters at each."""
    items = leaves(model)
    total = _count(items)
    end = _head_start(items) if u_shaped else len(items)
    return [(name, _count(items[:i + 1]) / total) for i, (name, _) in enumerate(items)
            if _count(items[:i + 1]) and _count(items[i + 1:end])]


def describe_choices(model: nn.Module, u_shaped: bool = False) -> str:
    choices = cut_choices(model, u_shaped)
    if choices:
        return ", ".join(f"{name} ({share:.1%})" for name, share in choices)
    learned = sum(1 for _, m in leaves(model) if _count([(None, m)]))
    need = "three (the agent's bottom, the server's middle, the agent's head)" if u_shaped else "two"
    return (f"none: the model has {learned} learned layer(s) and a{' U-shaped' if u_shaped else ''} cut needs {need} "
            "(an MLP gets more with problem.model.hidden, e.g. [100,100])")


def cut_model(model: nn.Module, cut: str | None, u_shaped: bool = False) -> Parts:
    """Deep copies of the parts of ``model`` cut after leaf ``cut`` (None: the smallest valid bottom).

    A name that is not a valid cut is one `ConfigError` line listing the valid ones and their shares.
    """
    choices = dict(cut_choices(model, u_shaped))
    if cut is None and choices:
        cut = next(iter(choices))
    if cut not in choices:
        what = "U-shaped (algorithm.labels=agent) " if u_shaped else ""
        raise ConfigError(f"algorithm.cut={cut} is not a valid {what}cut of this model (each side needs parameters); "
                          f"valid cuts (the agent's share of the parameters): {describe_choices(model, u_shaped)}")
    items = leaves(model)
    at = [name for name, _ in items].index(cut) + 1
    end = _head_start(items) if u_shaped else len(items)
    part = lambda chunk: nn.Sequential(*(copy.deepcopy(m) for _, m in chunk))  # noqa: E731
    return Parts(bottom=part(items[:at]), top=part(items[at:end]), head=part(items[end:]) if u_shaped else None)
