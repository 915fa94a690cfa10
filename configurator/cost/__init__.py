"""Time of one training iteration: layer compute (:mod:`~configurator.cost.compute`), the
links each parallel group uses (:mod:`~configurator.cost.communication`), the critical path
(:mod:`~configurator.cost.iteration`), FLOP counts (:mod:`~configurator.cost.flops`) and the
published measurements used to calibrate and check it (:mod:`~configurator.cost.groundtruth`).

May import ``configurator.core``, ``memory_model`` and ``topology``.
"""
