"""Names shared by the CRD, the builders and the API module: the resource, labels, annotations."""

from __future__ import annotations

GROUP = "sparkapp.dev"
VERSION = "v1alpha1"
KIND = "PersistentPipeline"
PLURAL = "persistentpipelines"
API_VERSION = f"{GROUP}/{VERSION}"

MAX_NAME_LENGTH = 56
"""A pipeline's name leaves room for the "-driver" and "-cleanup" suffixes in a 63-character DNS label."""

# Labels put on every object the operator creates.
LABEL_PIPELINE = "sparkapp.dev/pipeline"
LABEL_ROLE = "sparkapp.dev/role"
ROLE_DRIVER = "driver"
ROLE_CLEANUP = "state-cleanup"

# Annotations on the driver pod: what it was launched with, compared with the spec to
# decide whether a running driver still matches it.
ANNOTATION_EPOCH = "sparkapp.dev/epoch"
ANNOTATION_SPEC_HASH = "sparkapp.dev/spec-hash"
ANNOTATION_RESTART_NONCE = "sparkapp.dev/restart-nonce"
ANNOTATION_STATE_ROOT = "sparkapp.dev/state-root"

DRIVER_CONTAINER = "driver"
CLEANUP_CONTAINER = "reset"
RELEASE_CONTAINER = "release-holds"
STATE_MOUNT_PATH = "/var/lib/spark-app/state"
"""Where a filesystem backend's PersistentVolumeClaim is mounted in driver and cleanup pods."""
LIVE_SETTINGS_MOUNT_PATH = "/etc/spark-app/live"
"""Where the driver pod's downward API volume of its live settings annotation is mounted."""
LIVE_SETTINGS_FILE_NAME = "settings.json"
POD_IP_ENV = "SPARK_APP_POD_IP"
"""The driver's own IP (downward API), referenced as $(SPARK_APP_POD_IP) in spark.driver.host."""


def driver_pod_name(pipeline: str) -> str:
    """One fixed name per pipeline: the API server itself then refuses a second driver pod."""
    return f"{pipeline}-driver"


def driver_service_name(pipeline: str) -> str:
    return f"{pipeline}-driver"


def cleanup_pod_name(pipeline: str) -> str:
    return f"{pipeline}-cleanup"


def labels(pipeline: str, role: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "persistent-pipeline",
        "app.kubernetes.io/instance": pipeline,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": "pipeline-operator",
        LABEL_PIPELINE: pipeline,
        LABEL_ROLE: role,
    }
