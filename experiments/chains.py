"""Random layer chains for pipeline experiments and tests (heterogeneous, nonlinear in
micro-batch)."""

from __future__ import annotations

import numpy as np

from planner.pipeline.schedule import LayerChain


def random_chain(seed: int, layers: int, batch: int = 64, memory_scale: float = 1.0) -> LayerChain:
    """Layer times ``c_l * b**alpha_l + overhead`` (alpha in [0.6, 1]: small micro-batches are less
    efficient), activations linear in b, static memory and gradient sync drawn per layer."""
    rng = np.random.default_rng(seed)
    counts = tuple(c for c in (1, 2, 4, 8, 16, 32, 64) if batch % c == 0)
    sizes = tuple(batch // c for c in counts)
    base = rng.uniform(0.2, 3.0, size=layers) * 1e-3
    alpha = rng.uniform(0.6, 1.0, size=layers)
    b = np.array(sizes, dtype=float)
    time = base[:, None] * b[None, :] ** alpha[:, None] + 2e-5
    act_bytes = rng.uniform(1e6, 4e6, size=layers)[:, None] * b[None, :]
    act_memory = act_bytes * rng.uniform(2.0, 6.0, size=layers)[:, None] * memory_scale
    static = rng.uniform(1e8, 1e9, size=layers) * memory_scale
    sync = rng.uniform(1e-4, 1e-3, size=layers)
    return LayerChain(sizes, counts, time, act_bytes, act_memory, static, sync, 25e9, 1e-5)
