"""Fixtures shared by every test folder.

`local_cluster` (session): the local control plane of localcluster/, started if it is not
running and stopped at the end only if this session started it. Under pytest-xdist the
workers share one cluster and none stops it (another may still use it): `make test` brings
it up before its parallel stage and down after; by hand, `make cluster-down`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from localcluster import ClusterInfo


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[ClusterInfo]:
    """A localcluster.ClusterInfo: kubeconfig, apiserver_url, s3_endpoint, env()."""
    from localcluster import Cluster

    cluster = Cluster()
    started_here = not cluster.is_up() and "PYTEST_XDIST_WORKER" not in os.environ
    info = cluster.ensure_up()
    yield info
    if started_here:
        cluster.down()
