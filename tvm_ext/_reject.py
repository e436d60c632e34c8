"""``Reject``: the falsy result of a check that says why. One class for passes and pattern tables.

A leaf module (imports nothing from tvm-ext). A check returns ``True`` (or anything truthy) to
accept, or ``Reject("reason")`` to refuse; drivers log ``reason`` under the rule's or pass's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

__all__ = ["Reject", "Check"]


@dataclass(frozen=True, repr=False)
class Reject:
    """A failed check: falsy, carries the reason (``return Reject("bias is not per-channel")``)."""

    reason: str

    def __post_init__(self):
        object.__setattr__(self, "reason", str(self.reason))

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.reason

    def __repr__(self) -> str:
        return f"Reject({self.reason!r})"


Check = Union[bool, Reject]
