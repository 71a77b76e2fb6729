"""`python -m demo run|clean` (make demo, make demo-clean): the whole story on the local cluster.

run:   start the local control plane; helm install the chart (the operator then runs as a
       pod, with its ServiceAccount token and the chart's RBAC); apply a word count, a
       connected-components iterate, a Kafka broker and a word count over one of its topics;
       feed input files and messages; kill -9 the drivers and feed more while they are down;
       watch the operator relaunch them and the drivers resume from their checkpoints; then
       a shared table: two readers applied before their publisher wait for it, start by
       themselves, follow its versions through kill -9 of the publisher and of a reader;
       check every output by folding its changelog; print a summary.
clean: remove everything run created, and stop the cluster if run started it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml

from demo import shared_tables, story
from demo.story import COMPONENTS_OUTPUT, EDGE_FILES, KAFKACOUNT_OUTPUT, WORDCOUNT_OUTPUT, Namespace
from demo.targets import LOCAL_VALUES, ROOT, LocalTarget

RELEASE, SYSTEM, NAMESPACE = "persistent-pipelines", "pp-system", "pp-demo"
CHART = ROOT / "charts" / "persistent-pipelines"
STATE_FILE = ROOT / ".cache" / "demo" / "state.json"
OPERATOR_ACCOUNT = f"system:serviceaccount:{SYSTEM}:{RELEASE}-operator"
DRIVER_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:spark-app-driver"
WAIT = 420.0  # per step; a driver's JVM starts in 15 to 30 s on two cores, an iterate batch takes ~30 s
WORD_FILES = {name: story.word_file(seed, 40) for seed, name in enumerate(("a.csv", "b.csv", "c.csv", "d.csv"))}
SPARK_APP_IMAGE = "ghcr.io/persistent-pipelines/spark-app:0.1.0"
PIPELINES = (("wordcount", WORDCOUNT_OUTPUT), ("components", COMPONENTS_OUTPUT), ("kafkacount", KAFKACOUNT_OUTPUT))
# The shared-table chapter (demo/shared-tables.yaml): a publisher and its two readers.
PUBLISHER, TABLE = "orders-enriched", "customers"
TIERS_OUTPUT, TIERS_CHANGES, CLICKS_OUTPUT = "tiers/tiers.jsonlines", "tiers/customers.jsonlines", "clicks/enriched.jsonlines"
SHARED = ((PUBLISHER, None), ("tiers", TIERS_OUTPUT), ("clicks", CLICKS_OUTPUT))
STEPS = 12


class Demo:
    def __init__(self) -> None:
        self.began = time.monotonic()
        self.steps = 0
        self.target = LocalTarget()
        self.fed_words: list[str] = []
        self.fed_edges: list[str] = []
        self.fed_orders: list[int] = []
        self.fed_clicks: list[int] = []
        self.watching: tuple[tuple[str, str | None], ...] = PIPELINES
        self.facts: dict[str, Any] = {}
        self._last_progress = ""
        self._last_progress_at = 0.0

    # ---- printing ------------------------------------------------------------------------------

    def step(self, title: str) -> None:
        self.steps += 1
        print(f"\n>>> step {self.steps}/{STEPS} ({self.elapsed()}): {title}", flush=True)

    def say(self, text: str) -> None:
        print(f"    {text}", flush=True)

    def show(self, output: str) -> None:
        for line in output.rstrip().splitlines():
            self.say(line)

    def elapsed(self) -> str:
        seconds = int(time.monotonic() - self.began)
        return f"{seconds // 60}m{seconds % 60:02d}s"

    # ---- the story -----------------------------------------------------------------------------

    def run(self) -> None:
        self.step("start the local control plane (etcd, kube-apiserver v1.37.1, controller manager, node agent)")
        self.target.start()
        started = self.target.started_here or _load_state().get("started_cluster", False)
        _save_state({"started_cluster": started})
        self.say(f"{'started' if self.target.started_here else 'already up'}; kubeconfig {self.target.kubeconfig}")
        self.ns = Namespace(self.target, NAMESPACE)
        if self.ns.get("namespace", NAMESPACE):
            self.say("removing the previous demo's pipelines and namespaces first")
            remove_demo(self.target)

        self.step("helm install the chart: the operator runs as a pod under its own ServiceAccount and RBAC")
        self.install()

        self.step("apply three PersistentPipelines: a word count, connected components (iterate), and a word "
                  "count over a Kafka topic of the broker of demo/kafka.yaml")
        self.show(self.target.kubectl("apply", "-n", NAMESPACE, "-f", str(ROOT / "demo" / "pipelines.yaml")))
        self.show(self.target.kubectl("apply", "-n", NAMESPACE, "-f", str(ROOT / "demo" / "kafka.yaml")))
        # Not `kubectl wait pod/kafka-0`: right after the apply the pod may not exist yet
        # (the StatefulSet controller creates it), and wait fails at once on NotFound.
        self.target.kubectl("rollout", "status", "-n", NAMESPACE, "statefulset/kafka", "--timeout=180s")
        self.say("the Kafka broker kafka-0 is ready (Service kafka:9092)")
        # The pipeline's driver stops at start if its topic does not exist (exit code 2).
        self.run_producer("create-topic", [])
        self.say(f"a producer pod created the topic {story.KAFKA_TOPIC}")
        self.show(self.target.kubectl("apply", "-n", NAMESPACE, "-f", str(ROOT / "demo" / "kafka-pipeline.yaml")))
        self.say(f"their files: the claim 'data', on this machine {self.target.claim_folder(NAMESPACE, 'data')}")

        self.step("feed the first input files and messages, and watch the drivers start and commit")
        self.feed("a.csv", "1.csv")
        self.wait_for_outputs()
        self.show(self.target.kubectl("get", "ppl", "-n", NAMESPACE, "-o", "wide"))

        self.step("more input: the outputs grow")
        self.feed("b.csv", "2.csv")
        self.wait_for_outputs()

        self.step("kill -9 the three drivers' processes (a crash: the pods stay), and feed input while they are down")
        self.crash(PIPELINES)
        self.feed("c.csv", "3.csv")

        self.step("the operator relaunches each driver at epoch 2; each resumes from its checkpoint (the Kafka "
                  "source from the offsets it committed)")
        self.wait_for_relaunch(PIPELINES)
        self.wait_for_outputs()

        self.step("input after the resume, including a deleted edge (the iterate deletes and rederives)")
        self.feed("d.csv", "4.csv")
        self.wait_for_outputs()

        story.wait_for("kafkacount's consumer lag in its status (its driver reports it with each lease renewal)",
                       lambda: story.checkpoint_of(self.ns.status("kafkacount")).get("lag"), WAIT,
                       progress=self.progress)
        self.shared_tables()

        self.step("check the outputs and summarise")
        self.summary()

    # ---- the shared-table chapter ----------------------------------------------------------------

    def shared_tables(self) -> None:
        self.watching = SHARED
        self.step(f"a shared table: apply two readers of {PUBLISHER}/{TABLE} before its publisher; tiers reads its "
                  "changes, clicks looks it up (demo/shared-tables.yaml)")
        readers = [d for d in yaml.safe_load_all((ROOT / "demo" / "shared-tables.yaml").read_text())
                   if d["metadata"]["name"] != PUBLISHER]
        self.show(self.target.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": readers})))
        for name in ("tiers", "clicks"):
            def waiting_for_table(n: str = name) -> dict[str, Any] | None:
                conditions = self.ns.status(n).get("conditions") or []
                return next((c for c in conditions if c.get("reason") == "WaitingForTable"), None)

            waiting = story.wait_for(f"{name} waiting for its table", waiting_for_table, WAIT, progress=self.progress)
            self.say(f"{name}: {self.ns.status(name).get('phase')}, {waiting['reason']}: {waiting['message']}")

        self.step(f"write orders and clicks, apply the publisher {PUBLISHER}: it commits the table's first "
                  "versions, and both readers start by themselves")
        self.feed_shared(orders=(0, 1), clicks=(0, 1))
        self.show(self.target.kubectl("apply", "-n", NAMESPACE, "-f", str(ROOT / "demo" / "shared-tables.yaml")))
        self.wait_for_shared()
        story.wait_for(f"both readers in {PUBLISHER}'s status as holders of {TABLE}",
                       lambda: len(self.holders()) == 2, WAIT, progress=self.progress)
        self.show(self.target.kubectl("get", "ppl", "-n", NAMESPACE, PUBLISHER, "-o", "wide"))
        self.say_table()

        self.step("kill -9 the publisher and the tiers reader, write more orders (a customer cancelled, one new) "
                  "and clicks while they are down; both resume at the next version")
        killed = SHARED[:2]
        self.crash(killed)
        self.feed_shared(orders=(2, 3), clicks=(2,))
        self.wait_for_relaunch(killed)
        self.wait_for_shared()
        story.wait_for("both readers at the table's latest version",
                       lambda: len(self.holders()) == 2 and not any(h["behind"] for h in self.holders()), WAIT,
                       progress=self.progress)
        self.say_table()

    def feed_shared(self, orders: tuple[int, ...], clicks: tuple[int, ...]) -> None:
        for number in orders:
            self.ns.write(f"orders/part-{number:04d}.csv", shared_tables.orders_csv(number))
        for number in clicks:
            self.ns.write(f"clicks/inputs/part-{number:04d}.csv", shared_tables.clicks_csv(number))
        self.fed_orders += orders
        self.fed_clicks += clicks
        self.say(f"wrote orders/ files {', '.join(map(str, orders))} and clicks/inputs/ files "
                 f"{', '.join(map(str, clicks))}")

    def shared_outputs(self) -> tuple[str | None, str | None, str | None]:
        return self.ns.read(TIERS_OUTPUT), self.ns.read(TIERS_CHANGES), self.ns.read(CLICKS_OUTPUT)

    def shared_exact(self, tiers: str | None, changes: str | None, clicks: str | None) -> dict[str, bool]:
        """Each reader's output against a plain computation over the orders and clicks fed."""
        return {"tiers": (shared_tables.folded_tiers(tiers) == shared_tables.expected_tiers(self.fed_orders)
                          and shared_tables.folded_customers(changes)
                          == shared_tables.expected_customers(self.fed_orders)),
                "clicks": shared_tables.clicks_multiset(clicks) == shared_tables.expected_clicks(self.fed_clicks)}

    def wait_for_shared(self) -> None:
        began = time.monotonic()
        story.wait_for("both readers' outputs to include every order and click",
                       lambda: all(self.shared_exact(*self.shared_outputs()).values()), WAIT,
                       progress=self.progress)
        self.progress(force=True)
        self.say(f"the readers caught up with the input in {time.monotonic() - began:.0f}s")

    def table(self) -> dict[str, Any]:
        found: dict[str, Any] = (self.ns.status(PUBLISHER).get("tables") or {}).get(TABLE) or {}
        return found

    def holders(self) -> list[dict[str, Any]]:
        holders: list[dict[str, Any]] = self.table().get("holders") or []
        return holders

    def say_table(self) -> None:
        t = self.table()
        self.say(f"{PUBLISHER}'s status.tables.{TABLE}: version {t.get('version')}, {t.get('rows')} rows, "
                 f"{t.get('bytes')} bytes, compaction frontier {t.get('compactionFrontier')}")
        for h in self.holders():
            self.say(f"  holder {h['reader']} ({h['kind']}): at version {h['version']}, behind by {h['behind']}"
                     f"{', blocks compaction' if h.get('blocking') else ''}")

    def install(self) -> None:
        for namespace in (SYSTEM, NAMESPACE):  # both enforce Pod Security "restricted"
            self.target.create_namespace(namespace)
        if self.target.kubectl("get", "crd", "persistentpipelines.sparkapp.dev", "--ignore-not-found", "-o", "name"):
            # Helm installs crds/ only when they are absent and never upgrades them.
            self.say("the CRDs exist from an earlier install: applying the chart's copy first (Helm never upgrades CRDs)")
            self.target.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
        command = ["upgrade", "--install", RELEASE, str(CHART), "--namespace", SYSTEM,
                   *self.target.helm_values(), "--wait", "--timeout", "3m"]
        self.say("helm " + " ".join(c.replace(str(ROOT) + "/", "") for c in command))
        began = time.monotonic()
        self.target.helm(*command)
        self.say(f"installed and ready in {time.monotonic() - began:.1f}s:")
        self.show(self.target.kubectl("get", "pods", "-n", SYSTEM, "-o", "custom-columns=POD:.metadata.name,"
                                      "STATUS:.status.phase,SERVICEACCOUNT:.spec.serviceAccountName,"
                                      "IMAGE:.spec.containers[0].image"))
        operator = [("create", "pods", NAMESPACE), ("get", "secrets", NAMESPACE), ("list", "secrets", NAMESPACE),
                    ("get", "secrets", "kube-system"), ("create", "pods", "kube-system"), ("delete", "namespaces", "")]
        self.say("the operator's RBAC (kubectl auth can-i): " + self.can_i(OPERATOR_ACCOUNT, operator))
        driver = [("patch", "pods", NAMESPACE), ("create", "pods", NAMESPACE), ("get", "secrets", NAMESPACE),
                  ("get", "pods", SYSTEM)]
        self.say("the drivers' RBAC (kubectl auth can-i): " + self.can_i(DRIVER_ACCOUNT, driver))

    def can_i(self, account: str, checks: list[tuple[str, str, str]]) -> str:
        answers = []
        for verb, resource, namespace in checks:
            where = ["-n", namespace] if namespace else []
            answer = self.target.kubectl("auth", "can-i", verb, resource, *where, f"--as={account}",
                                         check=False).strip()
            answers.append(f"{verb} {resource}{' in ' + namespace if namespace else ''}: {answer}")
        return "; ".join(answers)

    def feed(self, words: str, edges: str) -> None:
        self.ns.write(f"wordcount/inputs/{words}", story.words_csv(WORD_FILES[words]))
        self.ns.write(f"components/edges/{edges}", story.edges_csv(EDGE_FILES[edges]))
        self.produce(words)
        self.fed_words.append(words)
        self.fed_edges.append(edges)
        deleted = [f"{u}-{v}" for u, v, d in EDGE_FILES[edges] if d < 0]
        self.say(f"wrote wordcount/inputs/{words} ({len(WORD_FILES[words])} words) and components/edges/{edges} "
                 f"({len(EDGE_FILES[edges])} edge changes{', deleting ' + ', '.join(deleted) if deleted else ''}); "
                 f"a producer pod wrote the same {len(WORD_FILES[words])} words to the topic {story.KAFKA_TOPIC}")

    def produce(self, words: str) -> None:
        """The words of one input file as messages, in one transaction."""
        self.run_producer(f"produce-{words.removesuffix('.csv')}", WORD_FILES[words])

    def run_producer(self, name: str, words: list[str]) -> None:
        """A pod inside the cluster (the broker is reached by its Service name) that creates
        the topic if it is missing and writes ``words`` to it; waits for it to succeed."""
        pod = story.producer_pod(name, SPARK_APP_IMAGE, words)
        self.target.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(pod))
        self.target.kubectl("wait", "-n", NAMESPACE, "--for=jsonpath={.status.phase}=Succeeded", f"pod/{name}",
                            "--timeout=120s")

    def expected(self) -> tuple[dict[str, int], dict[int, int]]:
        return (story.expected_counts(WORD_FILES[f] for f in self.fed_words),
                story.expected_labels(EDGE_FILES[f] for f in self.fed_edges))

    def outputs(self) -> tuple[str | None, str | None, str | None]:
        return self.ns.read(WORDCOUNT_OUTPUT), self.ns.read(COMPONENTS_OUTPUT), self.ns.read(KAFKACOUNT_OUTPUT)

    def wait_for_outputs(self) -> None:
        counts, labels = self.expected()

        def caught_up() -> bool:
            words, components, kafka_words = self.outputs()
            return (story.folded_counts(words) == counts and story.folded_labels(components) == labels
                    and story.folded_counts(kafka_words) == counts)

        began = time.monotonic()
        story.wait_for("the three outputs to include every input file and message", caught_up, WAIT,
                       progress=self.progress)
        self.progress(force=True)
        self.say(f"the outputs caught up with the input in {time.monotonic() - began:.0f}s")

    def progress(self, force: bool = False) -> None:
        """One line per change of what the pipelines show (or every 20 s while waiting)."""
        parts = []
        for name, output in self.watching:
            status = self.ns.status(name)
            batch = story.checkpoint_of(status).get("batch")
            lines = f", {story.line_count(self.ns.read(output))} output lines" if output else ""
            parts.append(f"{name}: {status.get('phase', '-')}, epoch {story.epoch_of(status) or '-'}, "
                         f"batch {'-' if batch is None else batch}{lines}")
        line = " | ".join(parts)
        now = time.monotonic()
        if force or line != self._last_progress or now - self._last_progress_at > 20:
            print(f"    [{self.elapsed()}] {line}", flush=True)
            self._last_progress, self._last_progress_at = line, now

    def crash(self, pipelines: tuple[tuple[str, str | None], ...]) -> None:
        for name, output in pipelines:
            status = self.ns.status(name)
            self.facts[name] = {"epoch_before": story.epoch_of(status),
                                "batch_before": story.checkpoint_of(status).get("batch"),
                                "lines_before": story.line_count(self.ns.read(output)) if output else None}
            self.say(self.target.kill_container(NAMESPACE, f"{name}-driver", "driver"))

    def wait_for_relaunch(self, pipelines: tuple[tuple[str, str | None], ...]) -> None:
        for name, _ in pipelines:
            def relaunched(n: str = name) -> bool:
                return bool(self.ns.driver(n)) and (self.ns.epoch(n) or 0) >= 2

            def resumed_event(n: str = name) -> Any:
                return story.resumed_from(self.ns.events(n))

            story.wait_for(f"{name}'s driver at epoch 2", relaunched, WAIT, progress=self.progress)
            resumed = story.wait_for(f"{name}'s Resumed event", resumed_event, WAIT, progress=self.progress)
            status = self.ns.status(name)
            failure = status.get("lastFailure") or {}
            self.say(f"{name}: {failure.get('reason')} (exit code {failure.get('exitCode')}) at epoch "
                     f"{failure.get('epoch')}; now epoch {story.epoch_of(status)}, restarts {status['restarts']['total']}")
            for reason, message in self.ns.events(name):
                if reason in ("DriverLost", "Restarting", "Resumed"):
                    self.say(f"  Event {reason}: {story.first_words(message)}")
            self.facts[name]["resumed"] = resumed[-1]

    def summary(self) -> None:
        words, components, kafka_words = self.outputs()
        counts, labels = self.expected()
        exact = {"wordcount": story.folded_counts(words) == counts,
                 "components": story.folded_labels(components) == labels,
                 "kafkacount": story.folded_counts(kafka_words) == counts}
        metrics = (_metric_lines("persistent_pipeline_restarts_total") + _metric_lines("persistent_pipeline_source_lag")
                   + _metric_lines("persistent_pipeline_table_version") + _metric_lines("persistent_pipeline_table_holder_lag_versions"))
        total_words = sum(len(WORD_FILES[f]) for f in self.fed_words)
        print(f"\n=== summary: the whole story in {self.elapsed()} ===")
        for name, output, fed, table in (
                ("wordcount", words, f"{len(self.fed_words)} files, {total_words} words", f"{len(counts)} words counted"),
                ("components", components, f"{len(self.fed_edges)} edge files", f"{len(labels)} vertices labelled"),
                ("kafkacount", kafka_words, f"{total_words} messages of topic {story.KAFKA_TOPIC}",
                 f"{len(counts)} words counted")):
            facts, status = self.facts[name], self.ns.status(name)
            print(f"{name}:")
            print(f"  output lines: {facts['lines_before']} before the kill, {story.line_count(output)} now")
            print(f"  epoch {facts['epoch_before']} -> {story.epoch_of(status)}, restarts {status['restarts']['total']}, "
                  f"last batch committed before the kill: {facts['batch_before']}")
            print(f"  Resumed: {facts['resumed']}")
            print(f"  input: {fed}; folding the changelog: {table}, no row duplicated or missing; "
                  f"equal to a plain recomputation over all input: {'yes' if exact[name] else 'NO'}")
            if name == "components":
                print(f"  iterate {story.iterate_summary(self.ns.report('components'))}")
            if name == "kafkacount":
                checkpoint = story.checkpoint_of(status)
                print(f"  committed offsets: {json.dumps(checkpoint.get('offsets', {}), sort_keys=True)}; "
                      f"lag: {json.dumps(checkpoint.get('lag', {}), sort_keys=True)}")
        exact.update(self.shared_summary())
        if metrics:
            print("operator metrics: " + "; ".join(metrics))
        print(self.target.kubectl("get", "ppl", "-n", NAMESPACE, "-o", "wide").rstrip())
        print(f"\nThe pipelines keep running: add files under {self.target.claim_folder(NAMESPACE, 'data')}, "
              f"kill drivers with `.venv/bin/python -m localcluster kill {NAMESPACE}/wordcount-driver`, "
              f"`kubectl get ppl -n {NAMESPACE}` (KUBECONFIG={self.target.kubeconfig}). make demo-clean removes it all.")
        if not all(exact.values()):
            raise SystemExit("the outputs differ from a recomputation over the input")
        # One kill, one relaunch: any other restart is a failure the story did not cause.
        killed = {name: 1 for name, _ in PIPELINES} | {PUBLISHER: 1, "tiers": 1, "clicks": 0}
        extra = {name: (self.ns.status(name).get("restarts") or {}).get("total", 0) for name in killed}
        if extra != killed:
            raise SystemExit(f"the restarts should be {killed} (a kill -9 each), but they are {extra}: see the "
                             "pipelines' Events and lastFailure")


    def shared_summary(self) -> dict[str, bool]:
        """The shared-table chapter's lines of the summary; whether each reader's output is exact."""
        tiers, changes, clicks = self.shared_outputs()
        exact, t = self.shared_exact(tiers, changes, clicks), self.table()
        print(f"{PUBLISHER} (publishes {TABLE}):")
        print(f"  epoch {self.facts[PUBLISHER]['epoch_before']} -> {self.ns.epoch(PUBLISHER)}; "
              f"Resumed: {self.facts[PUBLISHER]['resumed']}")
        print(f"  input: {len(self.fed_orders)} order files; the table at version {t.get('version')}: {t.get('rows')} "
              f"customers, {t.get('bytes')} bytes, compaction frontier {t.get('compactionFrontier')}; holders: "
              + ", ".join(f"{h['reader']} at v{h['version']}" for h in self.holders()))
        print("tiers (reads the table's changes):")
        print(f"  epoch {self.facts['tiers']['epoch_before']} -> {self.ns.epoch('tiers')}; "
              f"Resumed: {self.facts['tiers']['resumed']}")
        print(f"  the changes fold to {len(shared_tables.folded_customers(changes))} customers and "
              f"{len(shared_tables.folded_tiers(tiers))} tiers, no row duplicated or missing; equal to a plain "
              f"recomputation over all orders: {'yes' if exact['tiers'] else 'NO'}")
        print("clicks (looks the table up):")
        print(f"  {story.line_count(clicks)} clicks of {len(self.fed_clicks)} files enriched with the region at "
              f"their batch's version; equal to a plain join: {'yes' if exact['clicks'] else 'NO'}")
        return exact


def remove_demo(target: LocalTarget) -> None:
    """Deletes the demo's pipelines (while the operator runs, so that their finalizer stops
    the drivers), the release, the namespaces and the claims' folders."""
    ns = Namespace(target, NAMESPACE)
    if ns.get("namespace", NAMESPACE):
        try:
            target.kubectl("delete", "ppl", "--all", "-n", NAMESPACE, "--timeout=120s")
        except RuntimeError:  # no operator left to release the finalizers
            for name, _ in PIPELINES + SHARED:
                target.kubectl("patch", "ppl", name, "-n", NAMESPACE, "--type=merge",
                               "-p", '{"metadata":{"finalizers":null}}', check=False)
    if target.helm("list", "-n", SYSTEM, "-q", "--filter", f"^{RELEASE}$").strip():
        target.helm("uninstall", RELEASE, "--namespace", SYSTEM, "--wait")
    target.kubectl("delete", "namespace", NAMESPACE, SYSTEM, "--ignore-not-found", "--timeout=180s")
    target.forget_claims(NAMESPACE)


def clean() -> None:
    target = LocalTarget()
    state = _load_state()
    if target.cluster.is_up():
        print(">>> removing the demo's pipelines, release, namespaces and claim folders", flush=True)
        remove_demo(target)
        if state.get("started_cluster"):
            print(">>> stopping the local cluster (the demo started it)", flush=True)
            target.stop()
    else:
        print(">>> the local cluster is not running; removing the demo's claim folders", flush=True)
        target.forget_claims(NAMESPACE)
    STATE_FILE.unlink(missing_ok=True)
    if STATE_FILE.parent.exists() and not any(STATE_FILE.parent.iterdir()):
        STATE_FILE.parent.rmdir()
    print(">>> demo removed", flush=True)


def _metric_lines(name: str) -> list[str]:
    """The operator's own counters, scraped from its metrics port (all pods listen on the
    host's loopback on the local cluster; the port is the chart's local value)."""
    import urllib.request

    port = yaml.safe_load(LOCAL_VALUES.read_text())["operator"]["metrics"]["port"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return []
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def _load_state() -> dict[str, Any]:
    return json.loads(STATE_FILE.read_text()) if STATE_FILE.exists() else {}


def _save_state(state: dict[str, Any]) -> None:
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps(state))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "clean"))
    options = parser.parse_args(argv)
    commands: dict[str, Callable[[], None]] = {"run": lambda: Demo().run(), "clean": clean}
    try:
        commands[options.command]()
    except (RuntimeError, TimeoutError, story.ChangelogError, subprocess.TimeoutExpired) as error:
        print(f"\ndemo failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

