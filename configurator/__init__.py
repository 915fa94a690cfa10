"""configurator: the fastest Megatron-LM parallel plan that fits, its launch script, and an
audit of the cluster's measured links.

Layers, each importing only those below it (``.importlinter`` holds the contracts that CI
checks with import-linter)::

    configurator.cli        parsing and printing; one table of commands
    configurator.app        one library function per command (search, estimate, launch,
                            topology import, audit), inputs resolved, outputs written
    configurator.report | launchers
                            ranked table, estimate text, plots | torchrun / SLURM scripts
    configurator.search     enumeration under Megatron's rules, memory filter, ranking,
                            the placement search
    configurator.cost       compute, communication, FLOPs, iteration time, the placed
                            schedule
    configurator.profiler   one decoder layer timed with torch (imported inside functions)
    memory_model | topology per-stage memory | GPUs, cluster graph, rank order, collectives,
                            importers, probe, audit
    configurator.core       errors, units, validation, ModelSpec, ParallelPlan (the plan
                            schema), Megatron's rules, pipeline schedule, plan document
"""

from configurator.core.version import __version__

__all__ = ["__version__"]
