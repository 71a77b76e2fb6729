"""From a container spec to the process to start: the termination message file, the hosts file,
what of the host's environment a container sees."""

from pathlib import Path
from typing import Any

from localcluster.kubelet.images import ImageConfig
from localcluster.kubelet.launch import PodPaths, base_env, build_launch
from localcluster.kubelet.volumes import Mount, VolumePlan

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": {}}
PATHS = PodPaths(Path("/cluster/pods/u-1"), Path("/cluster/logs/pods"))
DATA = {"data": VolumePlan("data", "emptyDir", "/cluster/pods/u-1/volumes/empty-dir/data", {})}


def launch(**container: Any):  # noqa: ANN201 - a LaunchSpec
    spec = {"name": "main", "command": ["true"], **container}
    return build_launch(POD, spec, ImageConfig(), {}, DATA, PATHS, restart_count=0)


def test_each_container_gets_its_own_file_at_the_default_termination_message_path() -> None:
    spec = launch()
    own = Path("/cluster/pods/u-1/containers/main/termination-log")
    assert spec.termination_file == own
    assert Mount(str(own), "/dev/termination-log", read_only=False) in spec.mounts
    assert spec.termination_policy == "File"


def test_a_termination_message_path_inside_a_volume_is_mounted_after_the_volume() -> None:
    spec = launch(terminationMessagePath="/data/why", terminationMessagePolicy="FallbackToLogsOnError",
                  volumeMounts=[{"name": "data", "mountPath": "/data"}])
    assert [m.target for m in spec.mounts if m.target != "/etc/hosts"] == ["/data", "/data/why"]
    assert spec.termination_policy == "FallbackToLogsOnError"


def test_an_empty_termination_message_path_mounts_no_termination_file() -> None:
    spec = launch(terminationMessagePath="")
    assert spec.termination_file is None and [m.target for m in spec.mounts] == ["/etc/hosts"]


def test_a_read_only_root_filesystem_is_passed_on_to_the_container() -> None:
    assert launch(securityContext={"readOnlyRootFilesystem": True}).read_only_root
    assert not launch(securityContext={"runAsNonRoot": True}).read_only_root and not launch().read_only_root


def test_every_container_gets_the_pods_hosts_file_at_etc_hosts() -> None:
    assert Mount("/cluster/pods/u-1/etc-hosts", "/etc/hosts", read_only=False) in launch().mounts


def test_a_container_that_mounts_its_own_etc_hosts_keeps_it() -> None:
    spec = launch(volumeMounts=[{"name": "data", "mountPath": "/etc/hosts", "subPath": "hosts"}])
    assert [m.source for m in spec.mounts if m.target == "/etc/hosts"] == [
        "/cluster/pods/u-1/volumes/empty-dir/data/hosts"
    ]


def test_of_the_hosts_environment_only_java_locale_and_the_jvms_options_reach_a_container() -> None:
    host = {"JAVA_HOME": "/jdk", "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1", "LANG": "C.UTF-8",
            "AWS_SECRET_ACCESS_KEY": "s3cr3t", "KUBECONFIG": "/root/.kube/config", "PATH": "/host/bin"}
    env = dict(base_env(POD, ImageConfig(), host))
    assert env["JAVA_TOOL_OPTIONS"] == "-XX:TieredStopAtLevel=1" and env["JAVA_HOME"] == "/jdk"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "KUBECONFIG" not in env
    assert env["PATH"] != "/host/bin"
