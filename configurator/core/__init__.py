"""The base every layer stands on: errors, units, input validation, the model spec
(:mod:`~configurator.core.model`; presets :mod:`~configurator.core.model_presets`, HF import
:mod:`~configurator.core.hf_import`), the plan schema (:mod:`~configurator.core.plan`),
Megatron's rules (:mod:`~configurator.core.rules`), the pipeline-schedule seam
(:mod:`~configurator.core.schedule`), the candidate column store and the plan document.

Imports nothing of the project outside ``configurator.core`` (numpy, yaml only).
"""
