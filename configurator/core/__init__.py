"""The base every layer stands on: errors, units, input validation, the model spec (presets,
HF import), the plan schema (:mod:`~configurator.core.plan`), Megatron's rules
(:mod:`~configurator.core.rules`), the pipeline-schedule seam
(:mod:`~configurator.core.schedule`), the candidate column store and the plan document.

Imports nothing of the project outside ``configurator.core`` (numpy, yaml only).
"""
