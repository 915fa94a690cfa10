"""Errors raised for bad user input.

Infeasible plans are *data* (reasons on an Evaluation); exceptions are only for input that
cannot be interpreted. Every message names the field, the value and the rule, on one line,
so the CLI can print it as is and exit with code 2.
"""

from __future__ import annotations

from configurator.core.limits import ECHO_CHARS


class InputError(ValueError):
    """Bad input: ``field``, the offending ``value`` and the ``rule`` it breaks.

    ``str(err)`` is a single line: ``"<field>=<value>: <rule>"``, the value's repr cut to
    :data:`~configurator.core.limits.ECHO_CHARS` characters and every line break (and other
    control character) shown as a space.
    """

    def __init__(self, field: str, value: object, rule: str):
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(one_line(f"{echo(field)}={echo(value, repr_=True)}: {rule}"))


def echo(value: object, repr_: bool = False) -> str:
    """``value`` (its repr with ``repr_``) cut to ECHO_CHARS characters, on one line."""
    try:
        text = repr(value) if repr_ else str(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still reported
        text = f"<{type(value).__name__}>"
    if len(text) > ECHO_CHARS:
        text = text[:ECHO_CHARS - 1] + "…"
    return one_line(text)


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (line breaks ``\\n`` ``\\r`` U+0085
    U+2028 U+2029, escape and other controls, bidirectional and other format characters,
    surrogates) replaced by a space."""
    return "".join(c if c.isprintable() else " " for c in text)


def flat(text: object) -> str:
    """``str(text)`` through :func:`one_line`, then every run of white space one space: fit
    for one line of a message, a file or a ``#`` comment (it cannot end the comment)."""
    return " ".join(one_line(str(text)).split())


class NoFeasiblePlanError(RuntimeError):
    """The search found no plan that fits; the message says why (exit code 3)."""
