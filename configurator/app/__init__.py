"""One library function per command, each taking a request dataclass and returning what the
CLI prints: :func:`~configurator.app.plan_jobs.run_search`,
:func:`~configurator.app.plan_jobs.run_estimate`, :func:`~configurator.app.plan_jobs.run_launch`,
:func:`~configurator.app.topology_jobs.import_topology`,
:func:`~configurator.app.topology_jobs.audit_cluster`,
:func:`~configurator.app.profile_jobs.run_profile`,
:func:`~configurator.app.cluster_plan_jobs.run_plan`. Resolves the user's references into
core objects (:mod:`~configurator.app.inputs`) and writes output files
(:mod:`~configurator.app.outputs`).

The steps the commands share, which ``plan`` (measurements to launch scripts) composes; a
command uses these, never another command's private helpers:

- inputs (:mod:`~configurator.app.inputs`): :func:`~configurator.app.inputs.resolve`,
  :func:`~configurator.app.inputs.load_measured_topology`,
  :func:`~configurator.app.inputs.cluster_ref_for`,
  :func:`~configurator.app.inputs.check_measured_gpu`,
  :func:`~configurator.app.inputs.audit_of`;
- search (:mod:`~configurator.app.plan_jobs`, as ``search`` and the audit's pricing run it):
  :class:`~configurator.app.plan_jobs.SearchLimits`,
  :func:`~configurator.app.plan_jobs.ranked_search`,
  :func:`~configurator.app.plan_jobs.search_on_fewer_hosts`,
  :func:`~configurator.app.plan_jobs.search_document`;
- the audit's pricing (:mod:`~configurator.app.audit_costs`):
  :func:`~configurator.app.audit_costs.measured_search_request`,
  :func:`~configurator.app.audit_costs.price_findings`,
  :func:`~configurator.app.audit_costs.price_in_days`,
  :func:`~configurator.app.audit_costs.island_crossings`,
  :func:`~configurator.app.audit_costs.audit_document`;
- outputs (:mod:`~configurator.app.outputs`, as ``search`` and ``launch`` write them):
  :func:`~configurator.app.outputs.check_out`, :func:`~configurator.app.outputs.search_files`.

The package imports none of them itself (importing ``configurator.app`` stays cheap).

May import every layer except ``configurator.cli``.
"""
