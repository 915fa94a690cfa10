"""Placement benches: the placement optimiser against exhaustive enumeration, a Pipette-style
baseline, the real 17-node H100 cluster and 128 hosts."""
