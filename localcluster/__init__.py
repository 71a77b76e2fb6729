"""A local Kubernetes control plane for tests and the demo, without Docker.

Real etcd, kube-apiserver and kube-controller-manager processes on loopback, a node agent
of ours that binds and runs pods as local processes (one mount namespace each), and a
local S3 server. See README.md in this folder.

    from localcluster import Cluster
    info = Cluster().ensure_up()   # ClusterInfo: kubeconfig, apiserver_url, s3_endpoint
"""

from localcluster.cluster import Cluster, ClusterError, ClusterInfo

__all__ = ["Cluster", "ClusterError", "ClusterInfo"]
