"""The hardware: GPU types with their peaks and efficiencies (:mod:`~topology.gpus`), the
cluster graph of measured links (:mod:`~topology.cluster`; presets and cluster files:
:mod:`~topology.cluster_files`), Megatron's rank order and the rank → GPU map
(:mod:`~topology.rank_order`), collective formulas (:mod:`~topology.collectives`), topology
files and their importers, the probe (run by torchrun; the only module that imports torch)
and the audit.

May import ``configurator.core`` and ``configurator.data`` only.
"""

from topology.cluster import Cluster
from topology.cluster_files import load_cluster
from topology.gpus import GPUSpec, GPU_PRESETS

__all__ = ["Cluster", "load_cluster", "GPUSpec", "GPU_PRESETS"]
