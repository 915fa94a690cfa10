"""Progress bars for work that can take more than a couple of seconds (validating or fitting
runs, importing logs, placing plans, pricing findings, the stages of ``plan``): one helper
for every command, so they all behave alike.

A bar is drawn by ``tqdm`` on stderr, never on stdout (what a command prints, ``--json``
included, stays clean), only when stderr is a terminal (a pipe, a file or a CI log gets
nothing) and not after :func:`set_quiet` (``--quiet``). It clears itself when done
(``leave=False``).
"""

from __future__ import annotations

import sys
from typing import Iterable, Sequence

_state = {"quiet": False}


def set_quiet(quiet: bool) -> None:
    """Silence every bar (``--quiet``), or let them show again on a terminal."""
    _state["quiet"] = bool(quiet)


def progress_shown() -> bool:
    """Whether a bar is drawn now: not quiet, and stderr is a terminal."""
    if _state["quiet"]:
        return False
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):       # no stderr, or a closed one
        return False


def progress(iterable: Iterable | None = None, *, desc: str, unit: str = "it",
             total: int | None = None, shown: bool | None = None):
    """A ``tqdm`` bar over ``iterable`` (or a manual one of ``total`` steps: call
    ``update()``) labelled ``desc``, counting ``unit``; drawn on stderr when ``shown``
    (None: :func:`progress_shown`), else a silent stand-in with the same methods."""
    from tqdm import tqdm

    visible = progress_shown() if shown is None else shown and not _state["quiet"]
    return tqdm(iterable, desc=desc, unit=unit, total=total, leave=False, file=sys.stderr,
                disable=not visible, dynamic_ncols=True)


class Stages:
    """A bar over the named stages of one job (``plan``: import, audit, search, …): each
    call ``stages("search")`` finishes the stage before and names the one starting. Use as a
    context manager (the bar is closed at the end)."""

    def __init__(self, desc: str, names: Sequence[str]):
        self.names = tuple(names)
        self.bar = progress(desc=desc, unit="step", total=len(self.names))
        self.started = False

    def __call__(self, name: str) -> None:
        if self.started:
            self.bar.update()
        self.started = True
        self.bar.set_postfix_str(name)

    def __enter__(self) -> "Stages":
        return self

    def __exit__(self, *exc) -> None:
        if self.started and not exc[0]:
            self.bar.update()
        self.bar.close()
