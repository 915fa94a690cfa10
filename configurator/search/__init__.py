"""The search: every plan Megatron accepts (:mod:`~configurator.search.space`), evaluated
(:mod:`~configurator.search.evaluate`), filtered by memory and ranked by predicted time
(:mod:`~configurator.search.rank`).

May import ``configurator.cost``, ``memory_model``, ``topology`` and ``configurator.core``.
"""
