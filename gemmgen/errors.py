"""Exceptions that carry a message meant for the user.

The CLI prints ``str(error)`` on one line (or a short list) and exits non-zero; it never shows
a traceback for these.
"""


class GemmgenError(Exception):
    """Base class: something the user asked for cannot be done, and why."""


class InvalidParameter(GemmgenError):
    """A parameter name or value is not allowed (unknown name, wrong type, out of range)."""


class InvalidPoint(GemmgenError):
    """A point violates one or more constraints of its family.

    ``violations`` lists every violated constraint, each with the values involved.
    """

    def __init__(self, name: str, violations: list[str]):
        self.name = name
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"invalid point {name}: {len(self.violations)} constraint(s) violated:\n{lines}")


class ToolNotFound(GemmgenError):
    """An external tool (nvcc, cuobjdump) is not installed or not on PATH."""
