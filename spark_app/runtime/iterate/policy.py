"""When a stored fixed point may be reused, and how: the decision of one iterate run.

Pure logic, no Spark; tests/unit/spark_app/test_iterate_policy.py covers every branch.

A fixed point F of a step with inputs I is a table with step(F, I) = F. After the inputs
change to I', which start gives the fixed point a cold run from the initial tables would
give?

* Nothing changed (same I, same step, F converged): F itself, with zero iterations.
* A monotone step (inflationary over a lattice, such as min-label propagation,
  reachability, shortest paths) with insertions only: F plus the new initial rows. Every
  fact derived from I is still derivable from I', so the least fixed point above F is the
  least fixed point of I'. This is not true after a deletion: F may hold facts derived
  only through what was deleted, and a monotone step never removes them.
* A contraction (PageRank with damping; any step whose fixed point is unique and reached
  from every start): F, whatever changed; the result matches a cold run within the
  tolerance.
* Otherwise the stored F cannot be trusted as it is. A monotone step that says which
  part of F may depend on the deleted rows (``invalidate``) resets exactly that part and
  re-iterates (delete and rederive); anything else recomputes cold from the stored inputs.

F is also distrusted when the step's fingerprint (code, parameters, schemas) changed or
when the run that produced it stopped at the iteration limit instead of converging.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    MONOTONE = "monotone"
    CONTRACTION = "contraction"
    GENERAL = "general"


class Mode(enum.Enum):
    REUSE = "reuse"
    """F is the answer; zero iterations."""
    WARM = "warm"
    """Start from F (plus new initial rows) and iterate."""
    PARTIAL = "partial"
    """Reset the part of F that may depend on deleted rows, keep the rest, iterate."""
    COLD = "cold"
    """Start from the initial tables, as if nothing were stored."""


@dataclass(frozen=True)
class Stored:
    """What the commit says about the stored F."""

    fingerprint: str
    converged: bool


@dataclass(frozen=True)
class Change:
    """How the inputs (and initial tables) changed since F was computed."""

    inserted: int
    deleted: int


@dataclass(frozen=True)
class Decision:
    mode: Mode
    reason: str


def decide(stored: Stored | None, change: Change, fingerprint: str, kind: Kind, can_invalidate: bool) -> Decision:
    if stored is None:
        return Decision(Mode.COLD, "no stored fixed point yet")
    if stored.fingerprint != fingerprint:
        return Decision(Mode.COLD, "the step changed (code, parameters or schemas): the stored fixed point belongs "
                                   "to another step")
    if not stored.converged:
        return Decision(Mode.COLD, "the stored result stopped at the iteration limit without converging")
    if change.inserted == 0 and change.deleted == 0:
        return Decision(Mode.REUSE, "the inputs are unchanged since the stored fixed point")
    if kind is Kind.CONTRACTION:
        return Decision(Mode.WARM, f"a contraction converges from any start ({_describe(change)})")
    if kind is Kind.MONOTONE and change.deleted == 0:
        return Decision(Mode.WARM, f"a monotone step with insertions only ({_describe(change)})")
    if kind is Kind.MONOTONE and can_invalidate:
        return Decision(Mode.PARTIAL, f"a monotone step with deletions ({_describe(change)}): resetting what may "
                                      "depend on the deleted rows")
    if kind is Kind.MONOTONE:
        return Decision(Mode.COLD, f"deletions under a monotone step ({_describe(change)}) and no invalidate "
                                   "function to say what depends on them")
    return Decision(Mode.COLD, f"the step is declared neither monotone nor a contraction ({_describe(change)})")


def _describe(change: Change) -> str:
    return f"{change.inserted} rows inserted, {change.deleted} deleted"
