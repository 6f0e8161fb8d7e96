"""Mesh specs, machine profiles (datasheet rows, symbolic, user JSON) and their errors."""

import json

import pytest

from planner.errors import MeshError, ProfileError
from planner.cluster.mesh import parse_mesh
from planner.cluster.profiles import SYMBOLIC, get_profile


def test_mesh_specs(a100):
    assert parse_mesh("8", a100).names == ("gpu",)
    mesh = parse_mesh("8x8", a100)
    assert mesh.names == ("node", "gpu") and mesh.num_devices == 64
    # NVLink inside, IB across
    assert mesh.axes[1].bandwidth == 300e9 and mesh.axes[0].bandwidth == 25e9
    named = parse_mesh("node=4,gpu=2", a100)
    assert (
        named.shape == (4, 2)
        and named.axes[1].bandwidth == 300e9
        and named.axes[0].bandwidth == 300e9
    )
    three = parse_mesh("4x8x8", a100)
    assert [a.bandwidth for a in three.axes] == [25e9, 25e9, 300e9]


def test_one_axis_mesh_larger_than_a_node_is_split_into_its_levels(a100):
    """`--mesh 16` on 8-GPU nodes is node=2,gpu=8 (not one ring at one GPU's NIC)."""
    flat, levels = parse_mesh("16", a100), parse_mesh("node=2,gpu=8", a100)
    assert flat == levels
    # not a whole number of nodes, or a named axis: kept as given
    assert parse_mesh("12", a100).shape == (12,)
    assert parse_mesh("dp=16", a100).shape == (16,)


def test_axis_spanning_nodes_costs_as_its_two_levels():
    """dp=128 beside tp=1 on 8-GPU H100 nodes spans 16 nodes with 8 members in each: a 1 GiB
    all-reduce over it costs what the hierarchical all-reduce over node=16,gpu=8 costs
    (reduce-scatter over NVLink, the 1/8 shard all-reduced across nodes at each GPU's NIC,
    all-gather over NVLink), hand-computed; dp=16 beside tp=8 has one member per node: one NIC."""
    from planner.cost.collectives import collective_seconds, hierarchical_all_reduce

    h100 = get_profile("h100-80g")
    wide = parse_mesh("pp=1,dp=128,tp=1", h100).axes[1]
    assert parse_mesh("pp=1,dp=16,tp=8", h100).axes[1].bandwidth == 50e9
    assert parse_mesh("dp=3,tp=4", h100).axes[0].bandwidth == 50e9  # 2 a node does not divide 3
    gib, nv, nic = 2**30, 450e9, 50e9
    by_hand = (
        2 * (7 * 2e-6 + 7 / 8 * gib / nv)  # reduce-scatter and all-gather over NVLink
        + 2 * 15 * 8e-6
        + 2 * 15 / 16 * gib / 8 / nic  # the shard across 16 nodes
    )
    flat = collective_seconds("all_reduce", 128, wide.bandwidth, wide.latency, gib)
    assert flat == pytest.approx(by_hand, rel=1e-9)
    levels = parse_mesh("node=16,gpu=8", h100)
    hierarchical = _seconds(levels, hierarchical_all_reduce("grad", [0, 1], gib, levels.shape))
    assert flat == pytest.approx(hierarchical, rel=1e-9)
    assert flat < 0.25 * collective_seconds("all_reduce", 128, nic, 8e-6, gib)


@pytest.mark.parametrize("levels", [1, 2, 3])
def test_an_all_reduce_over_one_two_and_three_levels_is_its_hand_computed_time(levels):
    """A 1 GiB all-reduce over every axis of gpu=8 / node=16,gpu=8 / rack=4,node=8,gpu=8 on H100
    (NVLink 4: 450 GB/s, 2 us a step; a GPU's NDR NIC: 50 GB/s, 8 us a step), written out step by
    step: reduce-scatter from the innermost level out, a ring all-reduce of the shard on the
    outermost, all-gather back (``hierarchical_all_reduce``; NCCL's tree/ring over NVLink first).
    A ring step moves (p - 1) / p of its buffer; the buffer shrinks by each inner level's size."""
    from planner.cost.collectives import hierarchical_all_reduce

    spec = {1: "gpu=8", 2: "node=16,gpu=8", 3: "rack=4,node=8,gpu=8"}[levels]
    mesh = parse_mesh(spec, get_profile("h100-80g"))
    gib, nv, nic, a_nv, a_nic = 2**30, 450e9, 50e9, 2e-6, 8e-6
    by_hand = {
        1: 2 * 7 * a_nv + 2 * 7 / 8 * gib / nv,
        2: 2 * (7 * a_nv + 7 / 8 * gib / nv) + 2 * 15 * a_nic + 2 * 15 / 16 * (gib / 8) / nic,
        3: 2 * (7 * a_nv + 7 / 8 * gib / nv)  # gpu level, out and back
        + 2 * (7 * a_nic + 7 / 8 * (gib / 8) / nic)  # node level: an eighth of the buffer
        + 2 * 3 * a_nic
        + 2 * 3 / 4 * (gib / 64) / nic,  # the racks' ring: a 64th
    }[levels]
    steps = hierarchical_all_reduce("grad", list(range(levels)), gib, mesh.shape)
    assert [c.kind for c in steps] == (
        ["reduce_scatter"] * (levels - 1) + ["all_reduce"] + ["all_gather"] * (levels - 1)
    )
    assert _seconds(mesh, steps) == pytest.approx(by_hand, rel=1e-12)


def test_an_nvl72_rack_is_one_nvlink_domain():
    """gb200-nvl72: 72 GPUs share NVLink 5 (900 GB/s a direction), so `--mesh 144` is two racks of
    72 (`node=2,gpu=72`), an axis of 72 stays on NVLink, and dp=144 beside tp=1 runs as its two
    levels (72 members in each rack: NVLink, then each GPU's 50 GB/s NIC for the 1/72 shard)."""
    gb200 = get_profile("gb200-nvl72")
    assert (gb200.gpus_per_node, gb200.peak_flops, gb200.fp8_flops) == (72, 2.5e15, 5e15)
    mesh = parse_mesh("144", gb200)
    assert mesh == parse_mesh("node=2,gpu=72", gb200) and mesh.shape == (2, 72)
    assert [a.bandwidth for a in mesh.axes] == [50e9, 900e9]
    assert parse_mesh("dp=2,tp=72", gb200).axes[1].bandwidth == 900e9
    wide = parse_mesh("pp=1,dp=144,tp=1", gb200).axes[1]
    per_byte = 71 / 72 / 900e9 + 1 / (2 * 72) / 50e9  # (p-1)/p / B of the two levels
    assert wide.bandwidth == pytest.approx(143 / 144 / per_byte, rel=1e-12)


# nccl-tests' bus bandwidth of an all-reduce of S bytes over n ranks taking t seconds:
# busbw = 2 (n - 1) / n * S / t (nccl-tests doc/PERFORMANCE.md)
def _busbw(seconds: float, n: int, size: float) -> float:
    return 2 * (n - 1) / n * size / seconds


@pytest.mark.parametrize(
    "device, measured",
    [
        # Azure ND A100 v4, NCCL 2.18.5: 228.10 GB/s at 1 GiB (the row's own source)
        ("a100-80g-measured", 228.10e9),
        # Azure ND H200 v5, NCCL 2.20.5, NVLS: 467.58 GB/s at 1 GiB (Azure/AI-benchmarking-guide,
        # Azure_Results/ND_H200_v5_results.md)
        ("h200-141g", 467.58e9),
        # Azure ND H100 v5, NCCL 2.18.5, NVLS, in place: 466.35 GB/s at 1 GiB (the guide's
        # Azure_Results/ND_H100_v5_results.md, as kept by its fork
        # samuel-bohman/AI-benchmarking-guide at commit 26d18e94)
        ("h100-80g", 466.35e9),
    ],
)
def test_a_1_gib_all_reduce_in_one_node_is_what_nccl_tests_measure(device, measured):
    """A 1 GiB all-reduce over the 8 GPUs of one node, priced, within 5% of the published
    nccl-tests bus bandwidth at that size (the datasheet's 450 GB/s on NVLink 4 is 3.8% under
    NVLS's measured 467.58 GB/s; the A100 row carries the measured figure itself)."""
    from planner.cost.collectives import collective_seconds

    axis = parse_mesh("8", get_profile(device)).axes[0]
    seconds = collective_seconds("all_reduce", 8, axis.bandwidth, axis.latency, 2**30)
    assert _busbw(seconds, 8, 2**30) == pytest.approx(measured, rel=0.05)


def test_the_measured_a100_differs_from_the_datasheet_one_by_its_cited_figures():
    sheet, measured = get_profile("a100-80g"), get_profile("a100-80g-measured")
    assert measured.intra_node_bandwidth / sheet.intra_node_bandwidth == pytest.approx(0.760, 1e-3)
    assert measured.inter_node_bandwidth / sheet.inter_node_bandwidth == pytest.approx(0.91)
    assert measured.hbm_bandwidth / sheet.hbm_bandwidth == pytest.approx(0.790, 1e-3)
    assert measured.gemm_efficiency == pytest.approx(253.7 / 312, 1e-3)
    assert (measured.peak_flops, measured.memory_bytes) == (sheet.peak_flops, sheet.memory_bytes)


@pytest.mark.parametrize("spec", ["", "8y", "0", "a=8,8", "x=2,x=2", "-2"])
def test_bad_mesh_specs(spec, a100):
    with pytest.raises(MeshError, match="--mesh"):
        parse_mesh(spec, a100)


def test_mesh_must_match_devices(a100):
    with pytest.raises(MeshError, match="--devices"):
        parse_mesh("2x4", a100, devices=16)


def test_profiles_from_datasheet_and_json(tmp_path):
    h100 = get_profile("h100-80g")
    assert h100.peak_flops == 989e12 and h100.inter_node_bandwidth == 50e9
    assert get_profile("symbolic") is SYMBOLIC
    path = tmp_path / "mine.json"
    path.write_text(
        json.dumps(
            {
                "peak_flops": 1e15,
                "memory_bytes": 96e9,
                "intra_node_bandwidth": 400e9,
                "inter_node_bandwidth": 50e9,
                "gpus_per_node": 4,
            }
        )
    )
    mine = get_profile(str(path))
    assert mine.name == "mine" and mine.gpus_per_node == 4
    path.write_text(
        json.dumps(
            {
                "peak_flops": -1,
                "memory_bytes": 1,
                "intra_node_bandwidth": 1,
                "inter_node_bandwidth": 1,
                "gpus_per_node": 1,
            }
        )
    )
    with pytest.raises(ProfileError, match="peak_flops"):
        get_profile(str(path))
    with pytest.raises(ProfileError, match="did you mean 'a100-80g'"):
        get_profile("a100-80")


def test_parallel_segment_workers_give_the_same_plan():
    from planner import make_cluster, make_problem
    from planner.search.exact import solve_exact

    problem = make_problem("resnet50", make_cluster("8", "a100-80g"))
    one, _ = solve_exact(problem, jobs=1)
    two, _ = solve_exact(problem, jobs=2)
    assert one.objective == two.objective and one.choice == two.choice


def test_one_worker_pool_serves_every_price_step(monkeypatch):
    """--jobs 2 under a binding memory limit on the Lagrangian fallback (the Pareto master is
    switched off here): the price takes many steps, all on one pool (a new pool per step cost
    seconds each), and the plan is the --jobs 1 plan. Tied parameters are solved in one process, so
    bert-base is conditioned here on one layout of its tied table."""
    import multiprocessing

    from planner import make_cluster, make_problem
    from planner.search import exact, lagrangian, master, reduce
    from planner.search.fallback import min_memory

    from planner.search.ties import conditioned, owner_groups

    tied = make_problem("bert-base", make_cluster("8", "a100-80g"))
    # one layout of the tied table: no ties left, pools in use
    ((owner, groups),) = owner_groups(tied).items()
    problem = conditioned(tied, {owner: sorted(groups)[0]})
    free, _ = exact.solve_exact(problem, jobs=1)
    limit = min_memory(problem) + 0.5 * (problem.memory(free.choice) - min_memory(problem))
    steps, pools = [], []
    real_unary, real_context = lagrangian.solve_unary, multiprocessing.get_context

    class Counting:
        def __init__(self, context):
            self.context = context

        def Pool(self, *args, **kwargs):
            pools.append(args[0])
            return self.context.Pool(*args, **kwargs)

    monkeypatch.setattr(
        reduce.multiprocessing, "get_context", lambda kind: Counting(real_context(kind))
    )
    monkeypatch.setattr(
        lagrangian, "solve_unary", lambda *a, **k: steps.append(1) or real_unary(*a, **k)
    )
    monkeypatch.setattr(
        master, "_pareto", lambda *a, **k: master.MasterRun(None, "Pareto master off")
    )
    two, _ = exact.solve_exact(problem, limit, jobs=2, time_limit_s=120)
    one, _ = exact.solve_exact(problem, limit, jobs=1, time_limit_s=120)
    assert len(steps) > 5 and pools == [2]
    assert two.objective == one.objective and two.status == one.status == "OPTIMAL"


def test_zero_collectives_run_inner_axis_first_and_equal_the_flat_axis():
    """ZeRO-3 on node=16,gpu=8: the gradient is reduce-scattered over NVLink first and only its
    1/8 shard crosses the nodes (the gathers mirror it), so a parameter's collectives cost what
    they cost on the flat dp=128 axis of `evaluate --dp 128` (axis_link), to rounding."""
    from planner.cost.operators import _sharded_param_comm

    h100 = get_profile("h100-80g")
    levels, flat = parse_mesh("node=16,gpu=8", h100), parse_mesh("dp=128", h100)
    nbytes, grad_nbytes = 2 * 2**28, 4 * 2**28
    comm = _sharded_param_comm(3, [0, 1], nbytes, grad_nbytes, levels.shape)
    assert [(c.kind, c.axis, c.nbytes) for c in comm[:2]] == [
        ("reduce_scatter", 1, grad_nbytes),
        ("all_gather", 1, nbytes),
    ]
    assert comm[3].axis == 0 and comm[3].nbytes == grad_nbytes / 8

    one_axis = _sharded_param_comm(3, [0], nbytes, grad_nbytes, flat.shape)
    assert _seconds(levels, comm) == pytest.approx(_seconds(flat, one_axis), rel=1e-9)


def _seconds(mesh, collectives) -> float:
    """The alpha-beta seconds of ``collectives`` on ``mesh``'s axes."""
    from planner.cost.collectives import collective_seconds

    return sum(
        collective_seconds(
            c.kind,
            mesh.axes[c.axis].size,
            mesh.axes[c.axis].bandwidth,
            mesh.axes[c.axis].latency,
            c.nbytes,
        )
        for c in collectives
    )
