"""Pods on the local node: exit codes, graceful deletion, volumes, env, images, logs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client, watch

from localcluster import ClusterInfo
from localcluster.kubectl import KubeCommands
from localcluster.testing import host_path, phase_in, shell_pod, wait_for

pytestmark = pytest.mark.cluster


def main_state(found: client.V1Pod) -> client.V1ContainerState:
    return found.status.container_statuses[0].state


def test_a_failing_command_fails_the_pod_with_its_exit_code(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, shell_pod("exit3", "echo bye; exit 3"))
    found = wait_for("phase Failed", phase_in(core, namespace, "exit3", "Failed", "Succeeded"))
    assert found.status.phase == "Failed"
    terminated = main_state(found).terminated
    assert terminated.exit_code == 3
    assert terminated.reason == "Error"
    assert terminated.started_at is not None and terminated.finished_at >= terminated.started_at


def test_a_successful_command_succeeds(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, shell_pod("ok", "true"))
    found = wait_for("phase Succeeded", phase_in(core, namespace, "ok", "Succeeded", "Failed"))
    assert found.status.phase == "Succeeded"
    assert main_state(found).terminated.reason == "Completed"
    conditions = {c.type: c.status for c in found.status.conditions}
    assert conditions["PodScheduled"] == "True" and conditions["Ready"] == "False"


def test_deleting_a_running_pod_sends_sigterm_to_its_process(
    core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    script = 'trap "echo handled > /data/marker; exit 7" TERM; echo up > /data/ready; while true; do sleep 0.1; done'
    manifest = shell_pod(
        "graceful",
        script,
        volumes=[{"name": "data", "hostPath": host_path(tmp_path)}],
        mounts=[{"name": "data", "mountPath": "/data"}],
        # The hook runs first, inside the container's mount namespace.
        lifecycle={"preStop": {"exec": {"command": ["sh", "-c", "echo hook > /data/pre-stop"]}}},
    )
    core.create_namespaced_pod(namespace, manifest)
    wait_for("the process to start", (tmp_path / "ready").exists)
    listing = core.list_namespaced_pod(namespace, field_selector="metadata.name=graceful")
    began = time.monotonic()
    core.delete_namespaced_pod("graceful", namespace)
    last_status = None
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        namespace,
        field_selector="metadata.name=graceful",
        resource_version=listing.metadata.resource_version,
        timeout_seconds=20,
    ):
        if event["type"] == "DELETED":
            break
        last_status = event["object"].status
    else:
        pytest.fail("the pod was not removed within 20s")
    assert (tmp_path / "pre-stop").read_text() == "hook\n"
    assert (tmp_path / "marker").read_text() == "handled\n"
    assert time.monotonic() - began < 8, (
        "the pod should go as soon as its process exits, not after the grace period"
    )
    assert last_status is not None
    terminated = last_status.container_statuses[0].state.terminated
    assert terminated is not None and terminated.exit_code == 7


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(
    core: client.CoreV1Api, namespace: str
) -> None:
    manifest = shell_pod("stubborn", 'trap "" TERM; while true; do sleep 0.1; done')
    manifest["spec"]["terminationGracePeriodSeconds"] = 1
    core.create_namespaced_pod(namespace, manifest)
    wait_for("Running", phase_in(core, namespace, "stubborn", "Running"))
    began = time.monotonic()
    core.delete_namespaced_pod("stubborn", namespace)
    wait_for("the pod to go", lambda: not core.list_namespaced_pod(namespace).items, timeout=15)
    assert 1 <= time.monotonic() - began < 6


def test_the_termination_message_file_is_each_containers_own(core: client.CoreV1Api, namespace: str) -> None:
    for name, words in (("first", "stale epoch; stored epoch is 4"), ("second", "another message")):
        core.create_namespaced_pod(namespace, shell_pod(name, f'printf "{words}" > /dev/termination-log; exit 3'))
    for name, words in (("first", "stale epoch; stored epoch is 4"), ("second", "another message")):
        found = wait_for(f"{name} Failed", phase_in(core, namespace, name, "Failed", "Succeeded"))
        assert main_state(found).terminated.message == words


def test_a_custom_termination_message_path_is_read(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, shell_pod("custom", "echo done > /tmp/why-I-stopped",
                                                    terminationMessagePath="/tmp/why-I-stopped"))
    found = wait_for("Succeeded", phase_in(core, namespace, "custom", "Succeeded", "Failed"))
    assert main_state(found).terminated.message == "done\n"


def test_fallback_to_logs_on_error_reports_the_logs_tail_of_a_failed_run(
    core: client.CoreV1Api, namespace: str
) -> None:
    script = 'for i in $(seq 1 100); do echo "line $i"; done; exit 1'
    core.create_namespaced_pod(namespace, shell_pod("fails", script, terminationMessagePolicy="FallbackToLogsOnError"))
    core.create_namespaced_pod(namespace, shell_pod("quiet", script))  # policy File: no message
    found = wait_for("fails Failed", phase_in(core, namespace, "fails", "Failed"))
    message = main_state(found).terminated.message
    assert message.splitlines() == [f"line {i}" for i in range(21, 101)]  # kubelet's last 80 lines
    quiet = wait_for("quiet Failed", phase_in(core, namespace, "quiet", "Failed"))
    assert not main_state(quiet).terminated.message


def test_a_read_only_root_filesystem_leaves_only_volumes_writable(core: client.CoreV1Api, namespace: str) -> None:
    script = ("touch /tmp/on-root 2>/dev/null && echo root-writable; touch /scratch/file && echo scratch-writable; "
              "echo x > /dev/null && echo devices-writable; echo done > /dev/termination-log")
    core.create_namespaced_pod(namespace, shell_pod(
        "readonly", script, securityContext={"readOnlyRootFilesystem": True},
        volumes=[{"name": "scratch", "emptyDir": {}}], mounts=[{"name": "scratch", "mountPath": "/scratch"}]))
    found = wait_for("readonly Succeeded", phase_in(core, namespace, "readonly", "Succeeded", "Failed"))
    assert main_state(found).terminated.message == "done\n"
    printed = core.read_namespaced_pod_log("readonly", namespace)
    assert printed.split() == ["scratch-writable", "devices-writable"]


def test_a_claims_folder_survives_the_pod(
    core: client.CoreV1Api, namespace: str, local_cluster: ClusterInfo
) -> None:
    claim = {
        "metadata": {"name": "state"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    core.create_namespaced_persistent_volume_claim(namespace, claim)
    bound = lambda: core.read_namespaced_persistent_volume_claim("state", namespace).status.phase == "Bound"  # noqa: E731
    wait_for("the claim to be bound to a provisioned volume", bound)
    volumes = [{"name": "state", "persistentVolumeClaim": {"claimName": "state"}}]
    mounts = [{"name": "state", "mountPath": "/state"}]
    writer = shell_pod("user", "echo first-run > /state/note", volumes=volumes, mounts=mounts)
    core.create_namespaced_pod(namespace, writer)
    wait_for("the writer to succeed", phase_in(core, namespace, "user", "Succeeded"))
    core.delete_namespaced_pod("user", namespace)
    wait_for("the writer to go", lambda: not core.list_namespaced_pod(namespace).items)
    reader = shell_pod("user", 'test "$(cat /state/note)" = first-run', volumes=volumes, mounts=mounts)
    core.create_namespaced_pod(namespace, reader)
    found = wait_for("the reader to finish", phase_in(core, namespace, "user", "Succeeded", "Failed"))
    assert found.status.phase == "Succeeded"
    host = local_cluster.kubeconfig.parent / "pv" / namespace / "state" / "note"
    assert host.read_text() == "first-run\n"


def test_a_pod_with_a_missing_claim_stays_pending_with_an_event(
    core: client.CoreV1Api, namespace: str
) -> None:
    volumes = [{"name": "state", "persistentVolumeClaim": {"claimName": "nope"}}]
    core.create_namespaced_pod(namespace, shell_pod("orphan", "true", volumes=volumes, mounts=[]))

    def mount_failure() -> str | None:
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=orphan").items
        return next((e.message for e in events if e.reason == "FailedMount"), None)

    assert 'persistentvolumeclaim "nope" not found' in wait_for("a FailedMount event", mount_failure)
    assert core.read_namespaced_pod("orphan", namespace).status.phase == "Pending"


def test_init_containers_run_first_in_order(core: client.CoreV1Api, namespace: str) -> None:
    manifest = shell_pod("ordered", 'test "$(cat /work/log)" = "$(printf "one\\ntwo")"')
    manifest["spec"]["volumes"] = [{"name": "work", "emptyDir": {}}]
    mount = [{"name": "work", "mountPath": "/work"}]
    manifest["spec"]["containers"][0]["volumeMounts"] = mount
    manifest["spec"]["initContainers"] = [
        {
            "name": f"init-{word}",
            "image": "busybox",
            "command": ["sh", "-c", f"echo {word} >> /work/log"],
            "volumeMounts": mount,
        }
        for word in ("one", "two")
    ]
    core.create_namespaced_pod(namespace, manifest)
    found = wait_for("the pod to finish", phase_in(core, namespace, "ordered", "Succeeded", "Failed"))
    assert found.status.phase == "Succeeded"
    assert [s.state.terminated.exit_code for s in found.status.init_container_statuses] == [0, 0]


def test_env_from_a_secret_reaches_the_process(core: client.CoreV1Api, namespace: str) -> None:
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="creds"), string_data={"password": "s3cr3t"})
    core.create_namespaced_secret(namespace, secret)
    env = [
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    script = 'test "$PASSWORD" = s3cr3t && test "$POD_NAME" = env && test -n "$KUBERNETES_SERVICE_PORT"'
    core.create_namespaced_pod(namespace, shell_pod("env", script, env=env))
    found = wait_for("the pod to finish", phase_in(core, namespace, "env", "Succeeded", "Failed"))
    assert found.status.phase == "Succeeded"


def test_a_missing_secret_key_is_a_config_error(core: client.CoreV1Api, namespace: str) -> None:
    env = [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]
    core.create_namespaced_pod(namespace, shell_pod("noconf", "true", env=env))

    def waiting() -> client.V1ContainerStateWaiting | None:
        statuses = core.read_namespaced_pod("noconf", namespace).status.container_statuses or []
        return (
            statuses[0].state.waiting
            if statuses and statuses[0].state.waiting.reason != "ContainerCreating"
            else None
        )

    state = wait_for("a waiting reason", waiting)
    assert state.reason == "CreateContainerConfigError"
    assert 'secret "absent" not found' in state.message


def test_an_unknown_image_cannot_be_pulled(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, shell_pod("stuck", "true", image="registry.example/nothing:1"))

    def pull_failure() -> client.V1ContainerStateWaiting | None:
        statuses = core.read_namespaced_pod("stuck", namespace).status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return waiting if waiting and waiting.reason in ("ErrImagePull", "ImagePullBackOff") else None

    state = wait_for("ErrImagePull", pull_failure)
    assert "images.yaml" in state.message
    wait_for("ImagePullBackOff", lambda: (s := pull_failure()) and s.reason == "ImagePullBackOff")
    assert core.read_namespaced_pod("stuck", namespace).status.phase == "Pending"


def test_kubectl_logs_returns_what_the_container_printed(
    core: client.CoreV1Api, namespace: str, kube: KubeCommands
) -> None:
    core.create_namespaced_pod(
        namespace, shell_pod("talker", "echo hello from the pod; echo to stderr >&2; echo last")
    )
    wait_for("the pod to finish", phase_in(core, namespace, "talker", "Succeeded"))
    logs = kube.kubectl("logs", "-n", namespace, "talker")
    assert logs.splitlines() == ["hello from the pod", "to stderr", "last"]
    assert kube.kubectl("logs", "-n", namespace, "talker", "--tail=1") == "last\n"
    assert core.read_namespaced_pod_log("talker", namespace, limit_bytes=5) == "hello"


def test_kubectl_logs_follow_ends_with_the_container(
    core: client.CoreV1Api, namespace: str, kube: KubeCommands
) -> None:
    core.create_namespaced_pod(
        namespace, shell_pod("ticker", "for i in 1 2 3; do echo tick $i; sleep 0.3; done")
    )
    wait_for("Running", phase_in(core, namespace, "ticker", "Running", "Succeeded"))
    logs = kube.kubectl("logs", "-f", "-n", namespace, "ticker", timeout=20)
    assert logs.splitlines() == ["tick 1", "tick 2", "tick 3"]


def test_crashing_containers_restart_with_back_off(
    core: client.CoreV1Api, namespace: str, kube: KubeCommands
) -> None:
    core.create_namespaced_pod(
        namespace, shell_pod("crasher", "echo run $(date +%N); exit 1", restart="OnFailure")
    )

    def backing_off() -> client.V1ContainerStatus | None:
        statuses = core.read_namespaced_pod("crasher", namespace).status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return statuses[0] if waiting and waiting.reason == "CrashLoopBackOff" else None

    status = wait_for("CrashLoopBackOff", backing_off)
    assert status.restart_count >= 1
    assert status.last_state.terminated.exit_code == 1
    assert core.read_namespaced_pod("crasher", namespace).status.phase == "Running"
    previous = kube.kubectl("logs", "--previous", "-n", namespace, "crasher")
    assert previous.startswith("run ")


def test_a_downward_api_file_follows_the_pods_annotations(
    core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    """A running process sees a changed annotation, as kubelet rewrites downwardAPI files
    (how the operator changes a driver's live settings without a restart)."""
    script = "while true; do cp /settings/rate /data/seen.tmp && mv /data/seen.tmp /data/seen; sleep 0.2; done"
    manifest = shell_pod(
        "downward",
        script,
        volumes=[
            {"name": "data", "hostPath": host_path(tmp_path)},
            {"name": "settings", "downwardAPI": {"items": [
                {"path": "rate", "fieldRef": {"fieldPath": "metadata.annotations['example.dev/rate']"}}]}},
        ],
        mounts=[{"name": "data", "mountPath": "/data"}, {"name": "settings", "mountPath": "/settings"}],
        grace_seconds=1,
    )
    manifest["metadata"]["annotations"] = {"example.dev/rate": "0"}
    core.create_namespaced_pod(namespace, manifest)
    seen = tmp_path / "seen"
    wait_for("the first value", lambda: seen.exists() and seen.read_text() == "0")
    core.patch_namespaced_pod("downward", namespace, {"metadata": {"annotations": {"example.dev/rate": "250"}}})
    wait_for("the changed value", lambda: seen.read_text() == "250")
    core.delete_namespaced_pod("downward", namespace)
