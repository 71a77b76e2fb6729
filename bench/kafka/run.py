"""`make bench-kafka`: a word count reading a Kafka topic, spark_app against the same query
written directly in Structured Streaming with a checkpoint (bench/kafka/baseline_wordcount.py),
on the same broker, in one run, ROUNDS times in alternation.

Each run gets a topic of its own (2 partitions, messages keyed by word) and a fresh driver:

1. Throughput: BACKLOG messages wait in the topic before the driver starts; from the first
   output line to the output counting every message, the messages of all batches but the
   first (which the JVM's warm-up distorts) over that time. The JVM still compiles through
   the next batch or two (with 1M messages, spark_app's second batch took 1.59 s against
   1.05 s and the eight after it 6.40 s against 6.37 s), so the backlog is 3M messages:
   the throughput of a running pipeline, not of its first seconds.
2. End-to-end latency: then a producer writes RATE messages a second for SECONDS seconds,
   each stamped with the time it was produced. A word's k-th message is processed when the
   output first shows that word's count at k or more; its latency is the moment the output
   file showed it (polled every 10 ms) less its stamp. p50 and p99 over all messages.

All runs read with read_committed, at most --max-offsets-per-trigger records a batch, a
trigger every 100 ms, and check that their final counts equal what was produced. Ratios are
spark_app over Structured Streaming (time, latency) and Structured Streaming over spark_app
(throughput): above 1, spark_app is slower. Goal: at most 1.10.

A third runner, the baseline with its JSON parse in a Python stage (as spark_app's source
parsed JSON until 2026-11-28, and parses CSV still), tells what such a stage costs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import REPO, SPARK_CONF, kill_driver, progress, spark_app, start_up_conf, write_results  # noqa: E402
from spark_app.runtime.jvm.worker_python import worker_python  # noqa: E402
from tests.support.kafka import KafkaBroker, start_broker, stop_broker  # noqa: E402

RUNNERS = ("spark_app", "structured_streaming", "structured_streaming_python_parse")
VOCABULARY = [f"w{i}" for i in range(1000)]
WEIGHTS = [1 / (i + 1) for i in range(len(VOCABULARY))]  # Zipf-like, as words in text are
POLL_S = 0.01


@dataclass
class Output:
    """Tails an output file of (word, count) rows: when each count of each word first showed."""

    path: Path
    changelog: bool
    """spark_app's rows carry diff (-1 retracts the old count of a word)."""
    seen: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    counts: dict[str, int] = field(default_factory=dict)
    first_line_at: float | None = None
    _offset: int = 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        now = time.time()
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            row = json.loads(line)
            if self.changelog and row["diff"] < 0:
                continue
            self.first_line_at = self.first_line_at or now
            self.counts[row["word"]] = row["count"]
            self.seen[row["word"]].append((row["count"], now))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def shown_at(self, word: str, count: int) -> float | None:
        """When the output first showed ``word`` counted ``count`` times or more."""
        for shown, moment in self.seen.get(word, ()):
            if shown >= count:
                return moment
        return None


def produce(broker: KafkaBroker, topic: str, words: list[str], rate: float | None = None) -> list[float]:
    """Writes one JSON message per word (keyed by it), stamped with when it was produced;
    at ``rate`` messages a second, or as fast as possible. Returns the stamps."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, "acks": "all",
                         "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000})
    stamps: list[float] = []
    began = time.time()
    for number, word in enumerate(words):
        if rate is not None:
            due = began + number / rate
            while (now := time.time()) < due:
                time.sleep(min(0.005, due - now))
        stamp = time.time()
        stamps.append(stamp)
        value = json.dumps({"word": word, "ts": int(stamp * 1000)}).encode()
        while True:
            try:
                producer.produce(topic, key=word.encode(), value=value)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(120):
        raise SystemExit(f"messages to {topic} not acknowledged")
    return stamps


def start_runner(name: str, broker: KafkaBroker, topic: str, folder: Path, max_offsets: int) -> subprocess.Popen[bytes]:
    output = folder / "out.jsonlines"
    if name == "spark_app":
        args = spark_app("examples/kafka_wordcount.py", "--topic", topic, "--bootstrap-servers",
                         broker.bootstrap_servers, "--output", str(output), "--state", str(folder / "state"),
                         "--trigger-interval-ms", "100", "--max-offsets-per-trigger", str(max_offsets))
    else:
        args = [sys.executable, str(REPO / "bench/kafka/baseline_wordcount.py"), "--bootstrap-servers",
                broker.bootstrap_servers, "--topic", topic, "--output", str(output),
                "--checkpoint", str(folder / "checkpoint"), "--trigger-interval-ms", "100",
                "--max-offsets-per-trigger", str(max_offsets),
                "--parse", "python" if name.endswith("python_parse") else "jvm"]
    # The baseline gets what spark_app's session adds for itself (the Kafka connector's jar).
    conf = SPARK_CONF if name == "spark_app" else {**SPARK_CONF, **start_up_conf()}
    # The baselines' Python workers start as spark_app's do (its launcher, importing the
    # installed pyspark rather than the zipped copy): the same start-up aids for both.
    python = {} if name == "spark_app" else {"PYSPARK_PYTHON": worker_python()}
    env = {**os.environ, **python, "PYTHONUNBUFFERED": "1", "SPARK_APP_SPARK_CONF": json.dumps(conf),
           "SPARK_APP_TERMINATION_LOG": str(folder / "driver.log.end")}
    with open(folder / "driver.log", "wb") as log:
        return subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_until(output: Output, total: int, process: subprocess.Popen[bytes], folder: Path, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while output.total < total:
        if process.poll() is not None:
            raise SystemExit(f"the driver exited ({process.returncode}); see {folder / 'driver.log'}")
        if time.monotonic() > deadline:
            raise SystemExit(f"the output counted {output.total:,} of {total:,} messages in {timeout:.0f}s; see {folder}")
        time.sleep(POLL_S)
        output.poll()
    if output.total != total:
        raise SystemExit(f"the output counted {output.total:,} messages, {total:,} were produced; see {folder}")
    return time.time()


def one_run(name: str, broker: KafkaBroker, folder: Path, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    topic = broker.new_topic(partitions=2)
    backlog = rng.choices(VOCABULARY, WEIGHTS, k=args.backlog)
    produce(broker, topic, backlog)
    output = Output(folder / "out.jsonlines", changelog=name == "spark_app")
    process = start_runner(name, broker, topic, folder, args.max_offsets_per_trigger)
    try:
        complete = wait_until(output, len(backlog), process, folder, timeout=900)
        assert output.first_line_at is not None
        first_batch = min(args.max_offsets_per_trigger, len(backlog))
        throughput = (len(backlog) - first_batch) / max(1e-3, complete - output.first_line_at)
        if Counter(backlog) != Counter(output.counts):
            raise SystemExit(f"{name}: the counts differ from what was produced; see {folder}")

        live = rng.choices(VOCABULARY, WEIGHTS, k=int(args.rate * args.seconds))
        produced_before = Counter(backlog)
        stamps: list[float] = []
        producer = threading.Thread(target=lambda: stamps.extend(produce(broker, topic, live, args.rate)))
        producer.start()
        while producer.is_alive():
            output.poll()
            time.sleep(POLL_S)
        wait_until(output, len(backlog) + len(live), process, folder, timeout=300)
        latencies = []
        for word, stamp in zip(live, stamps, strict=True):
            produced_before[word] += 1
            shown = output.shown_at(word, produced_before[word])
            assert shown is not None
            latencies.append(shown - stamp)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            kill_driver(process)
            process.wait()
    latencies.sort()
    result = {"throughput_msgs_per_s": round(throughput),
              "latency_p50_s": round(_percentile(latencies, 0.50), 3),
              "latency_p99_s": round(_percentile(latencies, 0.99), 3),
              "messages": len(backlog) + len(live)}
    progress(f"  {name}: {result['throughput_msgs_per_s']:,} messages/s; latency p50 {result['latency_p50_s']:.3f}s, "
             f"p99 {result['latency_p99_s']:.3f}s")
    return result


def _percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(fraction * len(values)))]


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    spark, plain = runs["spark_app"], runs["structured_streaming"]
    rounds = range(len(spark))
    ratios = {
        "throughput (Structured Streaming / spark_app)":
            [plain[r]["throughput_msgs_per_s"] / spark[r]["throughput_msgs_per_s"] for r in rounds],
        "latency p50 (spark_app / Structured Streaming)": [spark[r]["latency_p50_s"] / plain[r]["latency_p50_s"]
                                                           for r in rounds],
        "latency p99 (spark_app / Structured Streaming)": [spark[r]["latency_p99_s"] / plain[r]["latency_p99_s"]
                                                           for r in rounds],
    }
    # What the Python parsing stage alone costs a plain query (spark_app's source has one).
    python = runs.get("structured_streaming_python_parse")
    if python:
        ratios["throughput (Structured Streaming / the same with a Python parse)"] = [
            plain[r]["throughput_msgs_per_s"] / python[r]["throughput_msgs_per_s"] for r in rounds]
        ratios["latency p50 (the same with a Python parse / Structured Streaming)"] = [
            python[r]["latency_p50_s"] / plain[r]["latency_p50_s"] for r in rounds]
        ratios["latency p50 (spark_app / Structured Streaming with a Python parse)"] = [
            spark[r]["latency_p50_s"] / python[r]["latency_p50_s"] for r in rounds]
    summary = {name: {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                      "max": round(max(values), 3)} for name, values in ratios.items()}
    for name, numbers in summary.items():
        progress(f"{name}: median {numbers['median']:.2f} (rounds {numbers['min']:.2f} to {numbers['max']:.2f})")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=3_000_000, help="messages waiting before the driver starts")
    parser.add_argument("--rate", type=float, default=2000, help="messages a second in the latency phase")
    parser.add_argument("--seconds", type=float, default=20, help="length of the latency phase")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    progress(f"working in {work}; starting a Kafka broker")
    process, broker = start_broker(work / "broker")
    try:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in RUNNERS}
        for round_number in range(args.rounds):
            for name in RUNNERS:
                folder = work / f"{name}-{round_number}"
                folder.mkdir()
                progress(f"round {round_number + 1}/{args.rounds}: {name}")
                runs[name].append(one_run(name, broker, folder, args, seed=round_number))
        results = {
            "settings": {"backlog": args.backlog, "rate_per_s": args.rate, "seconds": args.seconds,
                         "max_offsets_per_trigger": args.max_offsets_per_trigger, "partitions": 2,
                         "vocabulary": len(VOCABULARY), "trigger_ms": 100, "spark_conf": SPARK_CONF},
            "runs": runs,
            "ratios": summarise(runs),
            "goal": "every ratio <= 1.10",
        }
        write_results("kafka", results)
    finally:
        stop_broker(process)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
