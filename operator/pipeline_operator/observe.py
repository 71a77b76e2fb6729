"""Pure readers of what the API server returns: a driver pod as the decision function
sees it, and the progress report the driver writes on its pod (spark_app.contract)."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline_operator import names
from spark_app import contract
from spark_app.contract import BackfillReport, DriverReport, QueryReport

__all__ = ["BackfillReport", "DriverPod", "DriverReport", "QueryReport", "driver_pod", "parse_report", "pod_phase"]

_STALE_EPOCH = re.compile(re.escape(contract.STALE_EPOCH_PREFIX) + r"(\d+)")


@dataclass(frozen=True)
class DriverPod:
    """A driver pod, as read from the API server a moment ago."""

    name: str
    uid: str
    epoch: int
    spec_hash: str = ""
    restart_nonce: str = ""
    state_root: str = ""
    created_at: float = 0.0
    terminating: bool = False
    """Deletion has started (the driver got SIGTERM or will soon); the pod still exists."""
    phase: str = "Pending"
    started_at: float | None = None
    """When the driver container started running, if it is running."""
    waiting_reason: str | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    report: DriverReport | None = None
    live_settings: str = ""
    """The live settings written on the pod (contract.LIVE_SETTINGS_ANNOTATION)."""

    @property
    def ended(self) -> bool:
        """The driver process is gone for good (restartPolicy Never): Failed or Succeeded."""
        return self.phase in ("Failed", "Succeeded")

    @property
    def stale_epoch(self) -> int | None:
        """The stored epoch named by a driver that refused to start with a stale one."""
        if self.exit_code != contract.EXIT_FENCED:
            return None
        return stale_epoch_in(self.message)


def stale_epoch_in(message: str) -> int | None:
    """Searches the whole message: with FallbackToLogsOnError it is the log's tail."""
    found = _STALE_EPOCH.search(message or "")
    return int(found.group(1)) if found else None


def driver_pod(pod: Mapping[str, Any]) -> DriverPod:
    meta = pod.get("metadata", {})
    annotations = meta.get("annotations") or {}
    status = pod.get("status") or {}
    container: Mapping[str, Any] = next((c for c in status.get("containerStatuses") or []
                                         if c.get("name") == names.DRIVER_CONTAINER), {})
    state = container.get("state") or {}
    running, terminated, waiting = state.get("running"), state.get("terminated"), state.get("waiting")
    reason = (terminated or {}).get("reason") or status.get("reason") or ""
    message = (terminated or {}).get("message") or status.get("message") or ""
    return DriverPod(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        epoch=_int(annotations.get(names.ANNOTATION_EPOCH)),
        spec_hash=annotations.get(names.ANNOTATION_SPEC_HASH, ""),
        restart_nonce=annotations.get(names.ANNOTATION_RESTART_NONCE, ""),
        state_root=annotations.get(names.ANNOTATION_STATE_ROOT, ""),
        created_at=parse_time(meta.get("creationTimestamp")) or 0.0,
        terminating=bool(meta.get("deletionTimestamp")),
        phase=status.get("phase") or "Pending",
        started_at=parse_time(running.get("startedAt")) if running else None,
        waiting_reason=waiting.get("reason") if waiting else None,
        exit_code=terminated.get("exitCode") if terminated else None,
        reason=reason,
        # The driver's words go into the status and Events: scrubbed here, as they are read.
        message=contract.scrub_credentials(message if reason != "Evicted" else (status.get("message") or message)),
        report=parse_report(annotations.get(contract.STATUS_ANNOTATION)),
        live_settings=annotations.get(contract.LIVE_SETTINGS_ANNOTATION, ""),
    )


def parse_report(text: str | None) -> DriverReport | None:
    """The driver's report (spark_app.contract.DriverReport), or None if absent or of
    another shape."""
    return DriverReport.from_json(text)


def pod_phase(pod: Mapping[str, Any] | None) -> str | None:
    if pod is None:
        return None
    return (pod.get("status") or {}).get("phase") or "Pending"


def format_time(moment: float, fraction: bool = True) -> str:
    """RFC 3339 in UTC, as Kubernetes writes times: with milliseconds unless ``fraction`` is
    False (conditions' lastTransitionTime, and messages)."""
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment))
    return f"{text}.{int(moment * 1000) % 1000:03d}Z" if fraction else f"{text}Z"


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 UTC time, with or without a fraction; None for none."""
    if not value:
        return None
    whole, _, rest = value.rstrip("Z").partition(".")
    seconds = float(calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")))
    return seconds + (float(f"0.{rest}") if rest else 0.0)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
