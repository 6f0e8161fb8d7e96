"""Experiment scripts: each is `python -m experiments.NAME` with `main(argv)`, writing one CSV under
results/."""
