"""Framework integrations, each an optional extra imported only when its module is.

- :mod:`exporter.integrations.lightning`: ``ExporterCallback`` for ``lightning.Trainer``
  (extra ``lightning``).
- :mod:`exporter.integrations.transformers`: ``ExporterCallback`` for ``transformers.Trainer``
  (extra ``transformers``).

Accelerate needs no integration: instrument what ``accelerator.prepare`` returns.
Nothing here is imported by ``import exporter``, and this package imports no framework.
"""

__all__: list[str] = []
