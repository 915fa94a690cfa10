"""The fuzzing unit: :class:`Case`, one CLI call (argv and the input files it names)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """One CLI call: ``argv`` (without the program name; paths relative to the directory the
    ``files`` are written into) and ``files`` (relative path, content)."""

    target: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...] = ()

    def size(self) -> int:
        return sum(len(a) + 1 for a in self.argv) + sum(len(n) + len(b) for n, b in self.files)

    def command(self) -> str:
        return shlex.join(["configurator", *self.argv])

    def __repr__(self) -> str:  # what Hypothesis prints as the falsifying example
        files = ", ".join(f"{n!r}: {preview(b)}" for n, b in self.files)
        return f"Case({self.target}: {self.command()} | files {{{files}}})"


def preview(data: bytes, limit: int = 300) -> str:
    text = repr(data[:limit])
    return text + (f"... ({len(data)} bytes)" if len(data) > limit else "")
