"""``spark_app.run``: start the declared pipeline and keep it running."""

from __future__ import annotations

import dataclasses
import logging
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from spark_app import contract
from spark_app.persistence import Backend, Config
from spark_app.runtime.driver import Driver, RunOptions
from spark_app.runtime.pipeline import current

if TYPE_CHECKING:
    from spark_app.runtime.iterate.declare import IterateResult


def run(
    persistence_config: Config | None = None,
    *,
    trigger_interval_ms: int = 1000,
    stop_when_idle: bool = False,
) -> None:
    """Runs every declared output until SIGTERM (or, with ``stop_when_idle``, until all
    available input is processed), resuming from the stored state.

    Without ``persistence_config`` the configuration injected by the operator is used; with
    neither, state goes to a temporary folder and is lost when the process ends.
    A failure ends the process with an exit code from ``spark_app.contract``.
    """
    _configure_logging()
    pipeline = current()
    environment = pipeline.environment
    config = persistence_config or _config_from(environment)
    if config.epoch is None and environment.epoch is not None:
        # The epoch belongs to whoever launched this process (the operator), not to the
        # pipeline's code, which may build its own Config.
        config = dataclasses.replace(config, epoch=environment.epoch)
    options = RunOptions(trigger_interval_ms=trigger_interval_ms, stop_when_idle=stop_when_idle)
    code = Driver(pipeline, config, options).run()
    if code != contract.EXIT_OK:
        sys.exit(code)


def iterate(
    step: Callable[..., Mapping[str, DataFrame]],
    *,
    persistent_id: str,
    limit: int | None = None,
    monotone: bool = False,
    tolerance: float | None = None,
    key: Mapping[str, list[str]] | None = None,
    invalidate: Callable[..., Mapping[str, DataFrame]] | None = None,
    version: str = "",
    **tables: DataFrame,
) -> IterateResult:
    """A fixed point whose converged result survives restarts.

    ``step(**tables)`` returns a dict with the next version of the iterated tables; the
    other tables are its inputs. Iteration stops when no iterated table changes (or after
    ``limit`` iterations). Tables may be streaming (each batch of changes updates the fixed
    point; a ``diff`` column of -1 deletes a row) or static.

    The stored result F is reused when that is provably correct and recomputed otherwise
    (see spark_app/runtime/iterate/policy.py): declare ``monotone=True`` for inflationary
    steps (min-label components, reachability, shortest paths), with an optional
    ``invalidate(**results, deleted=..., **inputs)`` returning the rows of F that may
    depend on deleted rows; or ``tolerance=...`` with ``key={table: [columns]}`` for
    contractions (PageRank), whose output changes below the tolerance are not emitted.
    Bump ``version`` when code the step calls changes meaning.
    """
    from spark_app.runtime.iterate.declare import declare

    return declare(current(), step, persistent_id, limit, monotone, tolerance, key, invalidate, version, tables)


def _config_from(environment: contract.DriverEnvironment) -> Config:
    if environment.injected is not None:
        return Config.injected(environment.injected)
    folder = tempfile.mkdtemp(prefix="spark_app-state-")
    warnings.warn(f"no persistence config given: state goes to {folder} and is lost when this process ends",
                  stacklevel=3)
    return Config.simple_config(Backend.filesystem(folder))


def _configure_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
