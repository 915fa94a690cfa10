"""Rendering for people: the ranked table and the estimate text
(:mod:`~configurator.report.table`), the search plot (:mod:`~configurator.report.plot`).
Returns text or writes a picture; never parses arguments.

May import ``configurator.search`` and the layers below it.
"""
