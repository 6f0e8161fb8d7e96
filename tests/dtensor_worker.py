"""Worker of tests/test_dtensor.py, run by torchrun on 4 gloo processes (CPU).

Builds the same 2-layer MLP as the test (fixed seed), places its parameters and input with the
DTensor placements exported by the planner, runs forward and backward, and compares the output and
the parameter gradients with the single-process run. Rank 0 writes the largest relative error.
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor

sys.path.insert(0, sys.argv[3])
from planner.engines.export import torch_placements  # noqa: E402
from test_dtensor import make_mlp  # noqa: E402


def main() -> None:
    export = json.loads(open(sys.argv[1]).read())
    dist.init_process_group("gloo")
    mesh = init_device_mesh(
        "cpu", tuple(export["mesh"]["shape"]), mesh_dim_names=tuple(export["mesh"]["axis_names"])
    )
    module, x = make_mlp()
    reference = module(x)
    reference.sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    module.zero_grad()
    placements = export["dtensor_placements"]
    for name, param in list(module.named_parameters()):
        owner, leaf = name.rsplit(".", 1)
        sub = module.get_submodule(owner)
        setattr(
            sub,
            leaf,
            torch.nn.Parameter(
                distribute_tensor(param.detach(), mesh, torch_placements(tuple(placements[name])))
            ),
        )
    x_placements = torch_placements(tuple(export["input_placements"]))
    out = module(distribute_tensor(x, mesh, x_placements))
    out = out.full_tensor() if isinstance(out, DTensor) else out
    out.sum().backward()
    errors = [float((out - reference).abs().max() / reference.abs().max())]
    for name, param in module.named_parameters():
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        errors.append(float((grad - ref_grads[name]).abs().max() / ref_grads[name].abs().max()))
    if dist.get_rank() == 0:
        open(sys.argv[2], "w").write(
            json.dumps({"max_rel_error": max(errors), "placements": placements})
        )
    dist.barrier()  # no rank tears gloo down while another still talks (seen to abort under load)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
