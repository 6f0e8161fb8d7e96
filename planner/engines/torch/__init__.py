"""The PyTorch engine: the importer (``torch.export`` -> IR), plans that train on torchrun processes
(DTensor placements, FSDP2, ``torch.distributed.pipelining``), exported plan files and their ranks.
Imports nothing of the JAX engine."""
