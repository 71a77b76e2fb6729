"""Fixtures shared by every test folder.

`local_cluster` (session): the local control plane of localcluster/, started if it is not
running and stopped at the end only if this session started it.
"""

from __future__ import annotations

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
    started_here = not cluster.is_up()
    info = cluster.ensure_up()
    yield info
    if started_here:
        cluster.down()
