"""The local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
KWOK GPU nodes, built from the pinned Go modules and run on 127.0.0.1 (see docs/devcluster.md).

Public entry points: ``cluster.up``, ``cluster.down``, ``cluster.status`` and
``build.ensure_binaries``. Only subprocess, the standard library, cryptography and PyYAML are
used here; the Kubernetes client belongs to ``phalanx.operator``.
"""
