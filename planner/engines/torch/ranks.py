"""The rank side of a torchrun job, shared by every PyTorch entry point: read the job, start the
process group and the device mesh, name its groups for the counters, write the result on one rank
and stop (``exit_now``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from planner.outputs import write_json
from planner.engines.executor import block


def read_job(argv: list[str] | None) -> tuple[dict, str]:
    """``JOB.json OUT.json`` from the command line: the job's fields and where to write the
    result."""
    job_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    return json.loads(Path(job_path).read_text()), out_path


def start(shape: tuple[int, ...], names: tuple[str, ...]):
    """The gloo process group (blocks live on the CPU; nccl runs are not built yet) and the device
    mesh of ``shape``: (torch.distributed, the mesh)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    return dist, init_device_mesh("cpu", shape, mesh_dim_names=names)


def axis_groups(mesh, names) -> dict:
    """Process-group name -> ((mesh axis,), its ranks), what the collective counters read."""
    import torch.distributed as dist

    return {
        mesh.get_group(name).group_name: (
            (name,),
            dist.get_process_group_ranks(mesh.get_group(name)),
        )
        for name in names
    }


def finish(out_path: str, result: dict | None) -> None:
    """Write ``result`` (on the one rank that has it), wait for every rank, end the process
    group."""
    import torch.distributed as dist

    if result is not None:
        write_json(out_path, result)
    dist.barrier()
    dist.destroy_process_group()


def exit_now(code: int) -> None:
    """End a torchrun rank once its work is done and its process group destroyed, skipping the
    interpreter's teardown: gloo's C++ state sometimes aborts there ('terminate called without an
    active exception', SIGABRT with no Python frame; seen about once in 40 FSDP2 runs), and torchrun
    would then fail a run whose results are written."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def local_block(value, layout, mesh_shape, coord):
    """The block of a whole tensor ``value`` that the device at ``coord`` holds in ``layout``."""
    return value[block(tuple(value.shape), layout, mesh_shape, coord)].contiguous()
