"""The usage history store: Workload lifecycle events in SQL (SQLite by default, PostgreSQL by
URL), their schema migrations, and the reports read from them.

Only :mod:`phalanx.operator` writes (its leader, through a bounded batched writer); the
``phalanx report`` and ``phalanx store`` commands read and migrate. Nothing here talks to the
Kubernetes API: events are derived from Workload objects the operator already holds.
"""
