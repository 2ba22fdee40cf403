"""Local test harness: a real Kubernetes control plane with fake GPU nodes, and Prometheus.

Binaries come from ``make cluster-bin`` (kube-apiserver, etcd, kwok, KEDA, ...) and
Debian's ``prometheus`` package (``make prometheus-bin``). The pytest fixtures in
``tests/integration/conftest.py`` wrap these classes; ``python -m cluster`` (with
``tests`` on ``PYTHONPATH``) backs ``make cluster-up`` / ``make cluster-down``.
"""
