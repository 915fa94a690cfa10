"""One library function per command, each taking a request dataclass and returning what the
CLI prints: :func:`~configurator.app.plan_jobs.run_search`,
:func:`~configurator.app.plan_jobs.run_estimate`, :func:`~configurator.app.plan_jobs.run_launch`,
:func:`~configurator.app.topology_jobs.import_topology`,
:func:`~configurator.app.topology_jobs.audit_cluster`,
:func:`~configurator.app.profile_jobs.run_profile`. Resolves the user's references into
core objects (:mod:`~configurator.app.inputs`) and writes output files
(:mod:`~configurator.app.outputs`).

May import every layer except ``configurator.cli``.
"""
