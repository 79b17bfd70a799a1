"""Framework integrations, each an optional extra imported only when its module is.

- :mod:`exporter.integrations.lightning`: ``ExporterCallback`` for ``lightning.Trainer``
  (extra ``lightning``).
- :mod:`exporter.integrations.transformers`: ``ExporterCallback`` for ``transformers.Trainer``
  (extra ``transformers``).

Accelerate needs no integration: instrument what ``accelerator.prepare`` returns.
Nothing here is imported by ``import exporter``, and this package imports no framework.
"""

__all__ = ["missing_extra"]


def missing_extra(exc: ImportError, extra: str) -> ImportError:
    """Return the ImportError an integration raises where its framework cannot be imported
    (``exc``): it names the extra to install, as a command that needs an extra does."""
    return ImportError(
        f"exporter.integrations.{extra} needs the {extra} extra ({exc}): "
        f"pip install 'ddp-exporter[{extra}]'",
        name=exc.name,
    )
