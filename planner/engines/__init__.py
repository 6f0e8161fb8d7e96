"""Engines around the planner, all leaves of the import graph and all optional: the torch importer
(``torch_import``, ``torch_presets``), plan export to JAX shardings and DTensor placements
(``export``), the numpy interpreter and virtual-device executor (``interpret``, ``executor``), XLA
compilation on emulated CPU devices (``xla``) and the plan verifier built on them (``verify``)."""
