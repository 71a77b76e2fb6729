"""The operator's domain errors. Handlers map them to kopf's errors at the edge
(pipeline_operator.handlers); nothing below the handlers imports kopf."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: the field (as a path from the resource root) and why."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


class InvalidSpec(Exception):
    """The spec cannot be run as it is; the user has to change it."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = tuple(problems)


class ApiUnavailable(Exception):
    """The API server did not answer as expected; retrying later may help."""


class Conflict(Exception):
    """The resource changed since it was read (optimistic concurrency): read it again and retry."""


class Refused(ApiUnavailable):
    """The API server refused a request for what it asked for (400, 403, 422: an admission
    policy, Pod Security, a quota, RBAC, an invalid field). Retrying the same request will
    not help; callers that can say why to the user catch it, the rest retry it as
    ApiUnavailable."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"the API server refused it ({status}): {reason}")
        self.status = status
        self.reason = reason
