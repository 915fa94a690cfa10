"""Cluster topology: GPU specs, the cluster graph (networkx) and collective timings."""

from topology.cluster import Cluster, load_cluster
from topology.gpus import GPUSpec, GPU_PRESETS

__all__ = ["Cluster", "load_cluster", "GPUSpec", "GPU_PRESETS"]
