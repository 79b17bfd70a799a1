"""Publish what the sources read: ``/metrics``, OTLP pushes and Prometheus discovery.

Nothing here takes the :class:`~exporter.observer.Observer`: each part is handed the small
things it reads (a :class:`~exporter.export.collector.RankSources`, a registry, an identity,
a store), as prometheus_client's collectors are.
"""
