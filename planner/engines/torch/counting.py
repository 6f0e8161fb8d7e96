"""Collectives counted where PyTorch runs them: ``CommDebugMode`` extended with each collective's
bytes and mesh axes (DTensor's functional collectives, and FSDP2's c10d ones by process group), the
second referee beside XLA for ``verify --torch`` and ``run-torch``."""

from __future__ import annotations

# CommDebugMode's funcol ops -> (cost-model kind, the bytes n as the cost model counts them)
KINDS = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}


# c10d ops FSDP2 calls -> (cost-model kind, the argument whose bytes are n: the gathered output of
# an all-gather, the unreduced input of a reduce-scatter, the buffer of an all-reduce)
C10D = {
    "_allgather_base_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),
    "allreduce_": ("all_reduce", 0),
}


def _group_name(value) -> str | None:
    """The name of a process group passed to a c10d op (it reaches dispatch as a ScriptObject)."""
    import torch

    if not isinstance(value, torch.ScriptObject) or "ProcessGroup" not in str(value._type()):
        return None
    return torch.distributed.ProcessGroup.unbox(value).group_name


def _c10d_transfer(name: str, args, axis_of_group: dict) -> list:
    """A c10d collective on a process group of the plan's mesh: (kind, axes, bytes), or nothing."""
    group = next((_group_name(a) for a in args if _group_name(a)), None)
    if group not in axis_of_group:
        return []
    axis, _ = axis_of_group[group]
    kind, index = C10D[name]
    tensor = args[index]
    return [(kind, axis, float(tensor.numel() * tensor.element_size()))]


def _functional_transfer(kind: str, args, kwargs, axis_of_group: dict) -> list:
    """A functional collective (DTensor's) named by its group: (kind, axes, bytes), or nothing;
    an all-gather counts its output."""
    group = next(
        (
            a
            for a in list(args[1:]) + list((kwargs or {}).values())
            if isinstance(a, str) and a in axis_of_group
        ),
        None,
    )
    if group is None:
        return []
    size = args[0].numel() * args[0].element_size()
    n = size * len(axis_of_group[group][1]) if kind == "all_gather" else size
    return [(kind, axis_of_group[group][0], float(n))]


def counting_mode(axis_of_group: dict):
    """``CommDebugMode`` that also records (kind, mesh axes, n bytes) of every collective it counts.
    It runs without CommDebugMode's per-module tracker, whose forward hooks pop an empty parent list
    on modules whose pre-hook never fired: those ``torch.distributed.pipelining`` unflattens, and
    Llama's modules under transformers 5.25 (IndexError in ``_fw_set_module_hook``). The counts
    read here are the global ones."""
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    class Counting(CommDebugMode):
        def __init__(self):
            super().__init__()
            self.transfers = []
            self.fallback = []  # gloo's all-gathers that stand for an all-to-all (torch_edges)
            self.advanced_module_tracker = _GlobalOnly()

        def as_all_to_all(self, count_from: int, nbytes: float) -> None:
            """The collectives recorded since ``count_from`` were DTensor's CPU fallback for one
            all-to-all of a ``nbytes`` local buffer: record the all-to-all, keep them aside."""
            moved, self.transfers[count_from:] = self.transfers[count_from:], []
            self.fallback.extend(moved)
            if moved:
                self.transfers.append(("all_to_all", moved[0][1], nbytes))

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            name = getattr(getattr(func, "_overloadpacket", None), "__name__", "")
            if name in C10D:  # FSDP2's collectives (process-group objects)
                self.transfers.extend(_c10d_transfer(name, args, axis_of_group))
                return out
            kind = KINDS.get(name.rstrip("_"))
            if kind and out is not NotImplemented and isinstance(args[0], torch.Tensor):
                self.transfers.extend(_functional_transfer(kind, args, kwargs, axis_of_group))
            return out

    return Counting()


class _GlobalOnly:
    """CommDebugMode's module tracker reduced to what its dispatch reads: every count is
    "Global"."""

    name, is_bw, activation_checkpointing = "Global", False, False
    module_parents_dict = {"Global": set()}
    module_helper_dict: dict = {}
    module_parameters_dict: dict = {}
    sharding_dict: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return None
