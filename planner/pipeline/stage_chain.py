"""A model's layers as the pipeline searches cut them: the layer chain of one stage plan, with
what produced it, and the cost of given cuts and a given micro-batch count on it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from planner.cost.strategy import Strategy
from planner.errors import SettingsError, naming_parameters
from planner.ir.graph import Graph
from planner.pipeline.schedule import LayerChain, PipelinePlan
from planner.pipeline.search import given_cuts


@dataclass(frozen=True, slots=True)
class StageChain:
    """The layer chain of ``stages`` pipeline stages: ``chain`` (per layer and candidate
    micro-batch count: time, activations, memory), the stage plan it was costed under
    (``strategies`` by operator name, the search's ``stage_status``) and the stage graph at the
    reference micro-batch."""

    chain: LayerChain
    stages: int
    stage_status: str
    strategies: dict[str, Strategy]
    graph: Graph

    def cost(
        self,
        cuts: Sequence[int],
        num_microbatches: int | None = None,
        schedule: str = "1f1b",
        memory_limit: float = math.inf,
    ) -> PipelinePlan:
        """The pipeline of the given cuts (first layer of stages 1..p-1) at ``num_microbatches``
        (None: the chain's best count for these cuts), costed by the evaluator every cut search
        uses; status GIVEN, or INFEASIBLE over ``memory_limit``."""
        cuts = _cuts(cuts, self.stages)
        if num_microbatches is not None and (
            isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int)
        ):
            raise SettingsError(
                f"num_microbatches: a positive integer or None, got {num_microbatches!r}"
            )
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)):
            raise SettingsError(f"memory_limit: bytes (a number), got {memory_limit!r}")
        if not memory_limit > 0:  # NaN fails this too
            raise SettingsError(f"memory_limit: must be positive, got {memory_limit!r}")
        return given_cuts(self.chain, self.stages, schedule, memory_limit, cuts, num_microbatches)

    # the cut search's messages name the command line's flags (--cuts); a Python caller passed
    # cuts=, and reads "cuts: ..."
    cost = naming_parameters(cost, {})


def _cuts(cuts, stages: int) -> tuple[int, ...]:
    """``cuts`` as a tuple of integers, or a SettingsError naming the parameter."""
    if isinstance(cuts, (str, bytes)) or not isinstance(cuts, Sequence):
        raise SettingsError(
            f"cuts: a sequence of {stages - 1} layer indices (first layer of stages 1..p-1), "
            f"got {cuts!r}"
        )
    if any(isinstance(c, bool) or not isinstance(c, int) for c in cuts):
        raise SettingsError(f"cuts: layer indices must be integers, got {list(cuts)!r}")
    return tuple(cuts)
