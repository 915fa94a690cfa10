"""Time of one training iteration: layer compute (:mod:`~configurator.cost.compute`; its
GEMMs :mod:`~configurator.cost.gemm`, host and eager operations
:mod:`~configurator.cost.host_ops`, a mixture-of-experts MLP
:mod:`~configurator.cost.moe_compute`), the links each parallel group uses
(:mod:`~configurator.cost.communication`), the expert-parallel exchanges
(:mod:`~configurator.cost.expert_comm`), the critical path
(:mod:`~configurator.cost.iteration`), FLOP counts (:mod:`~configurator.cost.flops`) and the
published measurements used to calibrate and check it (:mod:`~configurator.cost.groundtruth`).

May import ``configurator.core``, ``memory_model`` and ``topology``.
"""
