"""The one-process reference of a PyTorch training run: the same SGD steps on whole tensors, from
the same initial values (``random_feeds``) as every rank."""

from __future__ import annotations

import numpy as np
from planner.engines.interpret import random_feeds
from planner.engines.interpret import run_graph


def feeds(graph, seed: int) -> dict:
    """Every graph input's initial value (``random_feeds``) as a float32 torch tensor."""
    import torch

    return {
        name: torch.from_numpy(np.ascontiguousarray(value))
        for name, value in random_feeds(graph, seed, "float32").items()
    }


def reference_losses(graph, steps: int, lr: float, seed: int) -> list[float]:
    """The same SGD steps in this process on whole tensors."""
    import torch

    from planner.engines.torch import xp as torch_xp

    values = feeds(graph, seed)
    params = {
        t.name: values[t.name].clone().requires_grad_(True)
        for t in graph.tensors
        if t.role == "param"
    }
    loss_tensor = graph.operators[-1].outputs[0].tensor
    losses = []
    for _ in range(steps):
        loss = run_graph(graph, {**values, **params}, torch_xp)[loss_tensor].sum()
        loss.backward()
        losses.append(float(loss.detach()))
        with torch.no_grad():
            for p in params.values():
                p -= lr * p.grad
                p.grad = None
    return losses
