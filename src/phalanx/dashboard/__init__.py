"""The read-only web dashboard: queues, quotas, pending workloads and the topology map.

:mod:`~phalanx.dashboard.model` builds the page data from API objects (pure);
:mod:`~phalanx.dashboard.source` watches them; :mod:`~phalanx.dashboard.server` serves the
page, the JSON and the live updates, each viewer reviewed by the API server.
"""
