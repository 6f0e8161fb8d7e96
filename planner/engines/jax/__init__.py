"""The JAX engine: a plan's training step compiled by XLA on emulated devices (its collectives read
from the HLO), plans that train on a JAX device mesh, 3D plans as stages. Imports nothing of the
PyTorch engine."""
