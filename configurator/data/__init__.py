"""Data files that ship with the tool, found through :mod:`importlib.resources` (never through
a path beside the checkout), so an installed wheel finds them as an editable checkout does.

``published/``
    Published training runs, one CSV per source, each row with its citation: what
    ``configurator validate`` and ``configurator calibrate`` price when given no run file
    (:mod:`configurator.cost.groundtruth` reads them).
``examples/``
    What ``configurator examples --out DIR`` copies for a newcomer: real nccl-tests logs of a
    17-node H100 cluster (Apache-2.0, with their licence and attribution), a small measured
    topology, an example run file, model file and cluster file.
``clusters/``
    ``presets.yaml``: the cluster presets (``--cluster NAME``), each with its ``source``
    (:data:`topology.cluster_files.CLUSTER_PRESETS` reads them).
``error_bars/``
    ``loso_residuals.json``: the leave-one-source-out residual percentiles per regime that
    every estimate's interval comes from (:mod:`configurator.search.intervals`), written by
    ``python -m bench.accuracy.error_bars --write``.

The ``README.md`` of ``published/`` and ``examples/`` names their sources.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["data_path", "CLUSTERS", "EXAMPLES", "PUBLISHED"]

#: Sub-folders of the package data.
PUBLISHED, EXAMPLES, CLUSTERS = "published", "examples", "clusters"


def data_path(*parts: str) -> Path:
    """The path of a file or folder of the shipped data: ``data_path("published",
    "sc21_table1.csv")``. Package data is installed as plain files (setuptools never zips a
    package), so the path can be opened, listed and copied like any other."""
    root = resources.files(__name__)
    return Path(str(root)).joinpath(*parts)
