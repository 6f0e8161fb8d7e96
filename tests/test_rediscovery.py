"""Known strategies are rediscovered by the exact planner."""

from planner import make_cluster, make_problem, plan
from planner.search.baselines import data_parallel
from planner.plans import make_plan, strategies_from_choice
from planner.search.solver import solve
from planner.zoo.transformers import transformer_block

COLUMN = {
    "attn.q": "a",
    "attn.k": "a",
    "attn.v": "a",
    "attn.scores": "a",
    "attn.softmax": "a",
    "attn.context": "a",
    "mlp.fc1": "f",
    "mlp.gelu": "f",
}
ROW = {"attn.proj": "a", "mlp.fc2": "f"}  # a and f are reduction dims of these two einsums


def test_gpt_block_few_tokens_large_hidden_is_megatron():
    result = plan(transformer_block(batch=1, seq=64, hidden=8192, heads=64), "8", "a100-80g")
    assert result.status == "OPTIMAL"
    chosen = {o.name: dict(o.strategy)["gpu"] for o in result.operators}
    assert {k: chosen[k] for k in COLUMN} == COLUMN
    assert {k: chosen[k] for k in ROW} == ROW
    problem = make_problem(
        transformer_block(batch=1, seq=64, hidden=8192, heads=64), make_cluster("8", "a100-80g")
    )
    record = problem.record(solve(problem).choice)
    forward_all_reduces = [c for c in record.comm if c.phase == "fwd" and c.kind == "all_reduce"]
    assert sum(c.count for c in forward_all_reduces) == 2  # one per sub-block (attention, MLP)
    # With HBM-bound layer norms (cost model v2) the first norm may also run sequence-parallel
    # (split on s, gathered before the column-parallel linears); nothing else moves forward.
    others = [c for c in record.comm if c.phase == "fwd" and c.kind != "all_reduce"]
    assert all(c.kind == "all_gather" for c in others)
    assert all(
        chosen[o.name] in (None, "s") for o in result.operators if o.kind in ("layernorm", "add")
    )


def test_resnet50_large_batch_is_data_parallel():
    result = plan("resnet50", "8", "a100-80g", batch=256)
    assert result.status == "OPTIMAL"
    convs = [o for o in result.operators if o.kind == "conv2d"]
    assert len(convs) == 53
    assert all(dict(o.strategy)["gpu"] == "b" for o in convs)
    # The classifier (2048x1000 weights, 256 samples) may legitimately replicate: it then skips the
    # 4 MB gradient all-reduce at the price of a small all-gather of its 256x2048 input.
    assert dict(result.strategy_of("fc"))["gpu"] in ("b", None, "n")


def test_gpt3_6_7b_on_8_a100_40g_shards_parameters():
    # the device's whole 40 GB (no reserve): the exact plan needs 37.19 GiB of its 37.25
    cluster = make_cluster("8", "a100-40g", memory=40e9)
    problem = make_problem("gpt3-6.7b", cluster)
    dp = make_plan(
        problem,
        data_parallel(problem),
        method="dp",
        status="GIVEN",
        memory_limit=cluster.memory_limit,
    )
    assert not dp.fits_memory  # 6.7B parameters x 16 bytes of Adam state do not fit in 40 GB
    result = solve(problem, cluster.memory_limit, time_limit_s=120)
    assert result.status == "OPTIMAL"
    best = make_plan(
        problem,
        strategies_from_choice(problem, result.choice),
        method="exact",
        status=result.status,
        memory_limit=cluster.memory_limit,
    )
    assert best.fits_memory
    params = dict(best.memory_breakdown)["params"]
    assert params < 0.5 * problem.graph.num_params * 2  # parameters are sharded, not replicated


def test_memory_below_minimum_is_infeasible_with_explanation():
    result = plan("gpt2-small", "8", "a100-80g", memory=2**20)
    assert result.status == "INFEASIBLE"
    assert "memory" in result.explanation and "recompute" in result.explanation
