"""Kafka topics: a source whose offsets commit with each batch, and an exactly-once sink."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame

from spark_app.contract import ContractError, KafkaConnection
from spark_app.runtime.pipeline import Pipeline, PipelineError, current
from spark_app.runtime.sources.kafka import (
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    METADATA_COLUMNS,
    STARTING_OFFSETS,
    VALUE_FORMATS,
    KafkaSourceSpec,
)
from spark_app.runtime.sources.parsing import CsvFormat


def read(
    topic: str | Sequence[str] | None = None,
    *,
    pattern: str | None = None,
    persistent_id: str,
    format: str = "json",
    schema: str | None = None,
    columns: Sequence[str] = (),
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int = DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    fail_on_data_loss: bool = True,
    bootstrap_servers: str | None = None,
    delimiter: str = ",",
    quote: str = '"',
) -> DataFrame:
    """A streaming DataFrame of the records of a topic, a list of topics or a ``pattern``.

    Each message's value is one record: ``format`` ``json`` (one object, fields matched by
    name, read by Spark's JSON reader; a key given twice counts its last value) or ``csv``
    (one line, fields in ``schema`` order) of ``schema`` (a Spark DDL string), or ``raw``
    (a ``value`` column of bytes, no schema). ``columns`` keeps any of key, headers, topic,
    partition, offset and timestamp beside them. A message that does not fit goes to the
    dead letters with its topic, partition, offset and error, and is counted; the pipeline
    goes on.

    Offsets commit with each batch under ``persistent_id``; a restart resumes from them
    (never from a consumer group). The first start reads from ``earliest`` or ``latest``.
    A batch reads about ``max_offsets_per_trigger`` offsets (Spark splits them over the
    partitions in proportion, at least one to each partition with records, so up to one
    more per partition); partitions added to a topic are picked up. Records removed by retention before they were read stop the driver with
    an error naming topic, partition and the gap, unless ``fail_on_data_loss=False``: then
    they are skipped and counted (``lost``). Only committed records of transactions are read.

    The cluster is the PersistentPipeline's ``spec.kafka`` (credentials from its Secret),
    or ``bootstrap_servers`` (plaintext; with the spec's servers, the spec's security).
    """
    topics = (topic,) if isinstance(topic, str) else tuple(topic or ())
    if bool(topics) == bool(pattern):
        raise PipelineError("sa.io.kafka.read: give a topic (or a list of topics), or a pattern, not both")
    if format not in VALUE_FORMATS:
        raise PipelineError(f"sa.io.kafka.read: format {format!r} is not one of {', '.join(VALUE_FORMATS)}")
    if (format == "raw") == (schema is not None):
        raise PipelineError("sa.io.kafka.read: format 'raw' takes no schema (the value is a column of bytes); "
                            "'json' and 'csv' need one")
    unknown = [c for c in columns if c not in METADATA_COLUMNS]
    if unknown:
        raise PipelineError(f"sa.io.kafka.read: columns {unknown} are not among {', '.join(METADATA_COLUMNS)}")
    if starting_offsets not in STARTING_OFFSETS:
        raise PipelineError(f"sa.io.kafka.read: starting_offsets {starting_offsets!r} is not one of "
                            f"{', '.join(STARTING_OFFSETS)}")
    if max_offsets_per_trigger < 1:
        raise PipelineError(f"sa.io.kafka.read: max_offsets_per_trigger must be at least 1, got "
                            f"{max_offsets_per_trigger}")
    pipeline = current()
    spec = KafkaSourceSpec(
        persistent_id=persistent_id, connection=_connection(pipeline, bootstrap_servers), topics=topics,
        pattern=pattern, value_format=format, schema=schema, columns=tuple(dict.fromkeys(columns)),
        starting_offsets=starting_offsets, max_offsets_per_trigger=max_offsets_per_trigger,
        fail_on_data_loss=fail_on_data_loss, csv=CsvFormat(header=False, delimiter=delimiter, quote=quote),
    )
    return pipeline.add_kafka_source(spec)


def _connection(pipeline: Pipeline, bootstrap_servers: str | None) -> KafkaConnection:
    injected = pipeline.environment.kafka
    if bootstrap_servers is None or (injected is not None and injected.bootstrap_servers == bootstrap_servers):
        if injected is None:
            raise PipelineError("no Kafka cluster to read: set spec.kafka.bootstrapServers on the "
                                "PersistentPipeline, or pass bootstrap_servers='host:port'")
        return injected
    try:
        return KafkaConnection(bootstrap_servers)
    except ContractError as error:
        raise PipelineError(f"sa.io.kafka: {error}") from None


def write(df: DataFrame, topic: str, *, key: Sequence[str] | None = None, name: str | None = None,
          bootstrap_servers: str | None = None) -> None:
    """Writes the changelog of ``df`` to ``topic``, exactly once: one Kafka transaction per
    batch (see spark_app.runtime.sinks.kafka).

    Each message's value is a changelog line, the row's JSON object with ``time`` and
    ``diff`` (+1 for a row that appears, -1 for one that goes; an updated group of an
    aggregation gives -1 of its old row and +1 of its new one); its key is the JSON array
    of the values of the key columns (inferred from the aggregation, or ``key``), so that
    a key's changes stay in order in one partition. Read the topic with
    ``isolation.level=read_committed``. ``name`` identifies the output in the stored state
    (default: the topic's name). The cluster is chosen as for ``read``.
    """
    pipeline = current()
    pipeline.add_output("kafka", df, topic, name, list(key) if key is not None else None,
                        connection=_connection(pipeline, bootstrap_servers),
                        message_key=tuple(key) if key is not None else None)
