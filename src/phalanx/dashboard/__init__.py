"""The read-only web dashboard: queues, quotas, pending workloads, the topology map and usage.

:mod:`~phalanx.dashboard.model` builds the page data from API objects (pure);
:mod:`~phalanx.dashboard.usage` reads usage over time from the history store and builds the
fair-share view; :mod:`~phalanx.dashboard.source` watches the objects;
:mod:`~phalanx.dashboard.server` serves the page, the JSON and the live updates, each viewer
reviewed by the API server.
"""
