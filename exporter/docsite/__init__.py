"""Generate the docs site's reference pages from the code: metrics, settings, alerts, API, CLI.

``ddp-exporter mixin generate`` writes them beside the monitoring files
(:mod:`exporter.generate`), so that a page cannot drift from what it documents.
"""
