"""Hypothesis generators of small random graphs and meshes, shared by the exactness tests."""

from hypothesis import strategies as st

from planner.cluster.mesh import MeshAxis, Mesh
from planner.cluster.profiles import MachineProfile
from planner.ir.ops import GraphBuilder

SIZES = (2, 4, 8)
KINDS = ("matmul", "relu", "add", "softmax", "layernorm", "transpose")


@st.composite
def meshes(draw, max_axes=3):
    n = draw(st.integers(1, max_axes))
    axes = []
    for i in range(n):
        size = draw(st.sampled_from((2, 4)))
        bandwidth = draw(st.sampled_from((1e9, 4e9, 25e9, 300e9)))
        latency = draw(st.sampled_from((0.0, 1e-6, 8e-6)))
        axes.append(MeshAxis(f"a{i}", size, bandwidth, latency))
    return Mesh(tuple(axes))


@st.composite
def graphs(draw, min_ops=2, max_ops=7):
    """A random DAG of matmul / elementwise / add / norm / transpose operators on 2-D tensors."""
    gb = GraphBuilder("random")
    pool = [gb.data("x", (draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES))))]
    if draw(st.booleans()):  # make the input an activation so gradients flow into it
        pool.append(gb.op("relu", "in", "bk->bk", [pool[0]]))
    n_ops = draw(st.integers(min_ops, max_ops))
    for i in range(n_ops):
        kind = draw(st.sampled_from(KINDS))
        x = draw(st.sampled_from(pool))
        rows, cols = gb.shape(x)
        name = f"op{i}"
        if kind == "matmul":
            width = draw(st.sampled_from(SIZES))
            out = gb.op("matmul", name, "bk,kn->bn", [x, gb.param(f"w{i}", (cols, width))])
        elif kind == "add":
            same = [t for t in pool if gb.shape(t) == (rows, cols)]
            out = gb.op("add", name, "bk,bk->bk", [x, draw(st.sampled_from(same))])
        elif kind in ("softmax", "layernorm"):
            out = gb.op(kind, name, "bk->bk", [x], norm="k")
        elif kind == "transpose":
            out = gb.op("transpose", name, "bk->kb", [x])
        else:
            out = gb.op("relu", name, "bk->bk", [x])
        pool.append(out)
    return gb.build()


def profiles():
    """Profiles where compute costs time (under SYMBOLIC, replicating everything costs 0)."""
    return st.sampled_from((COMPUTE_BOUND, MachineProfile("test", 1e12, 1e12, 100e9, 10e9, 8)))


# Compute costs time here (10^9 FLOP/s: a 8x8x8 matmul takes 1 us, a ring step 1-8 us), so the
# random optima split something; under SYMBOLIC (no compute weight) replicating all costs 0.
COMPUTE_BOUND = MachineProfile(
    "compute-bound",
    peak_flops=1e9,
    memory_bytes=1e12,
    intra_node_bandwidth=100e9,
    inter_node_bandwidth=10e9,
    gpus_per_node=8,
    kernel_launch_s=0.0,
)


def sharded(problem, choice) -> bool:
    """Whether a plan splits at least one operator (a non-trivial optimum)."""
    return any(any(d is not None for d in t.strategies[c]) for t, c in zip(problem.ops, choice))
