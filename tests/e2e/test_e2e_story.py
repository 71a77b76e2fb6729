"""The whole path, end to end: `helm install` of the chart, the operator running as a pod
with the chart's RBAC only, the demo's two pipelines (demo/pipelines.yaml: a word count and
a connected-components iterate), drivers killed with SIGKILL and resumed, `helm upgrade`
of the operator while pipelines run, `helm uninstall` and a reinstall that carries on, and
a pipeline with Kubernetes execution (one executor, state in S3). Both namespaces enforce
Pod Security "restricted", so every pod of the story passed it; the chart's admission
policies refuse what a pipeline or a driver may not do, and `kubectl auth can-i` checks
what the operator's and the drivers' accounts may.

One story, told in order: each test is a chapter and starts where the previous one ended
(the module's release and pipelines are shared). Every output is checked exactly: its
changelog is folded (a duplicated or lost row fails the fold) and compared with a plain
Python computation over every input file fed so far.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from e2e_release import ROOT, Release

from demo import story
from demo.story import COMPONENTS_OUTPUT, EDGE_FILES, WORDCOUNT_OUTPUT, Namespace, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.spark]

PIPELINES = ROOT / "demo" / "pipelines.yaml"
WORDS = {name: story.word_file(100 + seed, 30) for seed, name in enumerate(("a.csv", "b.csv", "c.csv", "d.csv",
                                                                           "e.csv"))}
# A driver's JVM starts in 15 to 30 s on two cores; an iterate batch takes about half a minute.
SPARK = 300.0


class Fed:
    """What the story has fed so far (shared by the chapters)."""

    words: list[str] = []
    edges: list[str] = []


def feed(ns: Namespace, words: str | None = None, edges: str | None = None) -> None:
    if words:
        ns.write(f"wordcount/inputs/{words}", story.words_csv(WORDS[words]))
        Fed.words.append(words)
    if edges:
        ns.write(f"components/edges/{edges}", story.edges_csv(EDGE_FILES[edges]))
        Fed.edges.append(edges)


def counts_exact(ns: Namespace) -> bool:
    return story.folded_counts(ns.read(WORDCOUNT_OUTPUT)) == story.expected_counts(WORDS[f] for f in Fed.words)


def labels_exact(ns: Namespace) -> bool:
    return story.folded_labels(ns.read(COMPONENTS_OUTPUT)) == story.expected_labels(EDGE_FILES[f] for f in Fed.edges)


def uid(pod: dict[str, Any] | None) -> str:
    assert pod is not None, "no running driver"
    return str(pod["metadata"]["uid"])


def operator_pod(release: Release) -> dict[str, Any]:
    pods = json.loads(release.target.kubectl("get", "pods", "-n", release.system, "-l",
                                             "app.kubernetes.io/component=operator", "-o", "json"))["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    assert len(running) == 1, [p["metadata"]["name"] for p in pods]
    return running[0]


def can_i(release: Release, account: str, verb: str, resource: str, namespace: str | None) -> bool:
    where = ["-n", namespace] if namespace else []
    answer = release.target.kubectl("auth", "can-i", verb, resource, *where, f"--as={account}", check=False)
    return answer.strip() == "yes"


def answer(release: Release, *args: str, stdin: str | None = None, token: str = "") -> str:
    """What kubectl prints (refusals included), as the admin or with ``token``."""
    auth = [f"--token={token}"] if token else []
    result = release.target.commands.run("kubectl", *auth, "-n", release.jobs.name, *args, stdin=stdin, timeout=60)
    return result.stdout + result.stderr


def as_driver(release: Release, pod: str, *args: str) -> str:
    """kubectl as the drivers' account with a token bound to ``pod``, as its pod mounts."""
    token = release.target.kubectl("create", "token", "spark-app-driver", "-n", release.jobs.name,
                                   "--bound-object-kind", "Pod", "--bound-object-name", pod, "--duration=10m")
    return answer(release, *args, token=token.strip())


def test_the_chart_installs_an_operator_that_runs_as_a_pod_with_least_privilege(release: Release) -> None:
    release.install()
    pod = operator_pod(release)
    assert pod["spec"]["serviceAccountName"] == "persistent-pipelines-operator"
    assert pod["spec"]["containers"][0]["image"] == "ghcr.io/persistent-pipelines/operator:0.1.0"
    assert f"--namespace={release.jobs.name}" in pod["spec"]["containers"][0]["args"]
    operator, driver, jobs = release.operator_account, release.driver_account, release.jobs.name
    assert can_i(release, operator, "create", "pods", jobs)
    assert can_i(release, operator, "update", "persistentpipelines.sparkapp.dev/status", jobs)
    assert can_i(release, operator, "get", "secrets", jobs), "the Secrets its pipelines name, where they run"
    assert not can_i(release, operator, "get", "secrets", release.system), "no Secrets elsewhere"
    assert not can_i(release, operator, "get", "secrets", "kube-system")
    assert not can_i(release, operator, "create", "pods", "kube-system"), "bound only where it serves"
    assert not can_i(release, operator, "list", "secrets", jobs), "it reads a Secret by name, never lists them"
    assert not can_i(release, operator, "delete", "namespaces", None)
    assert can_i(release, driver, "patch", "pods", jobs), "its progress report on its own pod"
    assert not can_i(release, driver, "create", "pods", jobs), "Local execution: no executor pods"
    assert not can_i(release, driver, "get", "secrets", jobs)
    assert not can_i(release, driver, "delete", "persistentvolumeclaims", jobs)
    assert not can_i(release, driver, "get", "pods", release.system), "nothing in another namespace"
    assert not can_i(release, driver, "patch", "pods", "default")


def test_pipelines_applied_with_kubectl_start_and_commit_their_input(release: Release) -> None:
    ns = release.jobs
    release.target.kubectl("apply", "-n", ns.name, "-f", str(PIPELINES))
    feed(ns, "a.csv", "1.csv")
    wait_for("both drivers running at epoch 1", lambda: all(ns.driver(p) and ns.epoch(p) == 1
                                                            for p in ("wordcount", "components")), 120)
    feed(ns, "b.csv")
    wait_for("the word counts of a.csv and b.csv", lambda: counts_exact(ns), SPARK)
    wait_for("the components of 1.csv", lambda: labels_exact(ns), SPARK)
    status = ns.status("wordcount")
    assert status["phase"] == "Running"
    assert status["persistence"]["root"] == f"pvc://state/{ns.name}/wordcount"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Ready"] == "True"
    assert story.reasons(ns.events("wordcount"))[:2] == ["Created", "Started"]


def test_drivers_run_restricted_and_may_change_only_their_own_report(release: Release) -> None:
    """The namespace enforces Pod Security "restricted", so the running drivers passed it;
    the chart's admission policies hold the rest: what a pipeline may ask for, and what a
    driver's account may do with pods (RBAC cannot say "its own pod")."""
    ns, jobs = release.jobs, release.jobs.name
    labels = json.loads(release.target.kubectl("get", "namespace", jobs, "-o", "json"))["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    driver = ns.driver("wordcount")
    assert driver is not None
    assert driver["spec"]["securityContext"]["runAsNonRoot"] is True
    assert driver["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True

    escalating = yaml.safe_load(PIPELINES.read_text().split("---")[2])  # the word count, asking for the host's root
    escalating["metadata"]["name"] = "escalating"
    escalating["spec"]["driver"]["podTemplate"]["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    refused = answer(release, "apply", "-f", "-", stdin=json.dumps(escalating))
    assert "spec.driver.podTemplate.spec.volumes[host].hostPath: hostPath volumes are not allowed" in refused, refused
    assert not ns.pipeline("escalating")

    report = driver["metadata"]["annotations"]["sparkapp.dev/status"]
    assert "annotated" in as_driver(release, "wordcount-driver", "annotate", "pod", "wordcount-driver",
                                    f"sparkapp.dev/status={report}", "--overwrite")
    for attempt in (("annotate", "pod", "components-driver", "sparkapp.dev/status={}", "--overwrite"),
                    ("label", "pod", "wordcount-driver", "e2e=spoofed"),
                    ("annotate", "pod", "wordcount-driver", "sparkapp.dev/epoch=99", "--overwrite")):
        said = as_driver(release, "wordcount-driver", *attempt)
        assert "a driver may change only the sparkapp.dev/status annotation of its own pod" in said, (attempt, said)
    said = as_driver(release, "wordcount-driver", "delete", "pod", "components-driver", "--wait=false")
    assert 'cannot delete resource "pods"' in said, said  # RBAC already: Local execution
    assert ns.driver("components") is not None


def test_killed_drivers_are_relaunched_at_a_higher_epoch_and_resume_without_loss_or_duplicates(
        release: Release) -> None:
    ns = release.jobs
    feed(ns, edges="2.csv")
    wait_for("2.csv in the components", lambda: labels_exact(ns), SPARK)
    before = {p: ns.checkpoint(p)["batch"] for p in ("wordcount", "components")}
    first_driver = {p: uid(ns.driver(p)) for p in before}

    for pipeline in before:
        release.target.kill_container(ns.name, f"{pipeline}-driver", "driver")
    feed(ns, "c.csv", "3.csv")  # while they are down

    for pipeline in before:
        wait_for(f"{pipeline} relaunched at epoch 2", lambda p=pipeline: ns.driver(p) and ns.epoch(p) == 2, 120)
        assert uid(ns.driver(pipeline)) != first_driver[pipeline]
        status = ns.status(pipeline)
        assert status["restarts"]["total"] == 1
        assert status["lastFailure"]["reason"] == "Killed(signal 9)" and status["lastFailure"]["epoch"] == 1
        resumed = wait_for(f"{pipeline}'s Resumed event", lambda p=pipeline: story.resumed_from(ns.events(p)), SPARK)
        query = "counts_jsonlines" if pipeline == "wordcount" else "components"
        assert f"resumed the state of epoch 1 from checkpoint: {query} batch {before[pipeline]}" in resumed[0]
        assert {"DriverLost", "Restarting", "Resumed"} <= set(story.reasons(ns.events(pipeline)))

    wait_for("the word counts of c.csv, written while the driver was down", lambda: counts_exact(ns), SPARK)
    wait_for("the components of 3.csv, written while the driver was down", lambda: labels_exact(ns), SPARK)
    feed(ns, edges="4.csv")  # deletes the edge 3-4: the stored fixed point is partly reset and rederived
    wait_for("the components after deleting an edge", lambda: labels_exact(ns), SPARK)
    iterate = next(q["iterate"] for q in ns.report("components")["queries"].values() if q.get("iterate"))
    assert iterate["decision"] == "partial" and iterate["runs"].get("reuse") == 1, iterate
    # The iterate's chapter ends here; the next ones need one driver only (two cores).
    release.target.kubectl("delete", "ppl", "components", "-n", ns.name, "--wait=false")


def test_a_helm_upgrade_of_the_operator_leaves_running_pipelines_alone(release: Release) -> None:
    ns = release.jobs
    old_operator = operator_pod(release)["metadata"]["uid"]
    driver = ns.driver("wordcount")
    assert driver is not None
    release.install("--set", "operator.podAnnotations.e2e/upgrade=two", "--set", "operator.logLevel=debug")
    new_operator = operator_pod(release)
    assert new_operator["metadata"]["uid"] != old_operator, "the upgrade replaced the operator pod"
    assert "--verbose" in new_operator["spec"]["containers"][0]["args"]
    feed(ns, "d.csv")
    wait_for("d.csv counted after the upgrade", lambda: counts_exact(ns), SPARK)
    still = ns.driver("wordcount")
    assert uid(still) == uid(driver), "the driver was not restarted"
    assert ns.epoch("wordcount") == 2 and ns.status("wordcount")["restarts"]["total"] == 1


def test_helm_uninstall_keeps_pipelines_and_state_and_a_reinstall_carries_on(release: Release) -> None:
    ns, target = release.jobs, release.target
    wait_for("components deleted by its finalizer", lambda: not ns.pipeline("components"), 120)
    release.uninstall()
    wait_for("the operator pod to stop", lambda: not target.kubectl("get", "pods", "-n", release.system,
                                                                    "-o", "name").strip(), 60)
    assert target.kubectl("get", "crd", "persistentpipelines.sparkapp.dev", "-o", "name").strip()
    assert ns.pipeline("wordcount"), "the pipeline outlives the operator"
    assert not target.kubectl("get", "role", "-n", ns.name, "-o", "name").strip(), "the drivers' RBAC went"
    assert ns.read(f"{ns.name}/wordcount/lease.json", claim="state") is not None, "the stored state is kept"

    release.install()
    driver = wait_for("the wordcount driver, still running", lambda: ns.driver("wordcount"), 60)
    target.kill_container(ns.name, "wordcount-driver", "driver")
    feed(ns, "e.csv")
    wait_for("a relaunch by the new operator at epoch 3", lambda: ns.driver("wordcount") and
             ns.epoch("wordcount") == 3, 120)
    assert uid(ns.driver("wordcount")) != uid(driver)
    wait_for("e.csv counted from the kept state", lambda: counts_exact(ns), SPARK)
    assert ns.status("wordcount")["restarts"]["total"] == 2


EXECUTOR_WORDS = {name: story.word_file(200 + seed, 25) for seed, name in enumerate(("x.csv", "y.csv"))}


def test_a_kubernetes_execution_pipeline_runs_a_restricted_executor_with_the_s3_credentials(release: Release) -> None:
    """Kubernetes execution, granted to this namespace only now: one executor, built by
    Spark from the operator's pod template, passes Pod Security "restricted" and writes
    the state stores into S3 with the credentials from the pipeline's Secret."""
    import boto3

    endpoint = release.target.s3_endpoint()
    if endpoint is None:
        pytest.skip("this cluster has no S3 server for the pods")
    ns, target, jobs = release.jobs, release.target, release.jobs.name
    target.kubectl("delete", "ppl", "wordcount", "-n", jobs, "--timeout=120s", timeout=180)  # two cores: one at a time
    release.install(kubernetes_executors=True)
    assert can_i(release, release.driver_account, "create", "pods", jobs)
    assert not can_i(release, release.driver_account, "get", "secrets", jobs), "executors: still no Secrets"

    bucket = f"e2e-{jobs[-5:]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="e2e",
                 aws_secret_access_key="e2e-secret").create_bucket(Bucket=bucket)
    target.kubectl("create", "secret", "generic", "s3-creds", "-n", jobs, "--from-literal=AWS_ACCESS_KEY_ID=e2e",
                   "--from-literal=AWS_SECRET_ACCESS_KEY=e2e-secret")
    pipeline = yaml.safe_load(PIPELINES.read_text().split("---")[2])
    pipeline["metadata"]["name"] = "executors"
    spec = pipeline["spec"]
    spec["application"]["args"] = ["--input", "/data/executors/inputs", "--output", "/data/executors/counts.jsonlines"]
    spec["application"]["sparkConf"] = {  # the executor reads the input files from the data claim too
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.claimName": "data",
        "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.mount.path": "/data"}
    spec["execution"] = {"mode": "Kubernetes", "executors": {"instances": 1, "cores": 1, "memory": "512m"}}
    spec["persistence"] = {"snapshotIntervalSeconds": 5, "s3": {
        "bucket": bucket, "endpoint": endpoint, "region": "us-east-1", "credentialsSecret": {"name": "s3-creds"}}}
    target.kubectl("apply", "-n", jobs, "-f", "-", stdin=json.dumps(pipeline))
    for name, words in EXECUTOR_WORDS.items():
        ns.write(f"executors/inputs/{name}", story.words_csv(words))

    def executor() -> dict[str, Any] | None:
        pods = ns.get("pods", "-l", "sparkapp.dev/pipeline=executors,sparkapp.dev/role=executor").get("items", [])
        return next((p for p in pods if p["status"].get("phase") == "Running"), None)

    pod = wait_for("the executor running", executor, SPARK)
    assert pod["metadata"]["ownerReferences"][0]["name"] == "executors-driver"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True and pod["spec"]["automountServiceAccountToken"] is False
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {
        "secretKeyRef": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"}}}
    expected = story.expected_counts(EXECUTOR_WORDS.values())
    wait_for("both files counted by the executor", lambda: story.folded_counts(
        ns.read("executors/counts.jsonlines")) == expected, SPARK)
    stored = [o["Key"] for o in boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                              aws_access_key_id="e2e", aws_secret_access_key="e2e-secret")
              .list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert any("/state/" in key for key in stored), "the executor wrote the aggregation's state store to S3"
    assert "e2e-secret" not in json.dumps(ns.pipeline("executors")) + json.dumps(pod)
