"""An exported PyTorch plan file (``planner export --target torch``) and what its runs start from:
the module built from the file's ``MODULE`` spec with a seed, and a batch drawn for it (integer
inputs below the smallest embedding table, floats from a normal draw)."""

from __future__ import annotations

import importlib.util
from planner.engines.torch.presets import build_spec


def load_plan_file(path: str):
    """The exported plan file as a Python module."""
    loader = importlib.util.spec_from_file_location("planner_torch_plan", path)
    plan = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(plan)
    return plan


def model_and_batch(plan, seed: int):
    """The plan file's module (seeded, in eval mode: no dropout) and a batch for it, with the
    generator."""
    import torch

    torch.manual_seed(seed)
    model, inputs, _ = build_spec(plan.MODULE)
    model.eval()  # no dropout: the runs must compute the same function
    # DTensor has no sharding rule for CPU flash attention
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    tables = [m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    generator = torch.Generator().manual_seed(seed + 1)
    batch = []
    for value in inputs:
        if value.is_floating_point():
            batch.append(torch.randn(value.shape, generator=generator))
        else:
            batch.append(torch.randint(0, min(tables, default=2), value.shape, generator=generator))
    return model, batch, generator
