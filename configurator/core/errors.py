"""Errors raised for bad user input.

Infeasible plans are *data* (reasons on an Evaluation); exceptions are only for input that
cannot be interpreted. Every message names the field, the value and the rule, on one line,
so the CLI can print it as is and exit with code 2.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: ``field``, the offending ``value`` and the ``rule`` it breaks.

    ``str(err)`` is a single line: ``"<field>=<value>: <rule>"``.
    """

    def __init__(self, field: str, value: object, rule: str):
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}={value!r}: {rule}".replace("\n", " "))


class NoFeasiblePlanError(RuntimeError):
    """The search found no plan that fits; the message says why (exit code 3)."""
