"""The cluster: device meshes with named axes and their links (``mesh``) and machine profiles read
from datasheet constants (``profiles``, with the table shipped in ``data/hardware.csv``)."""
