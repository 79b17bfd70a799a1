"""The folder ``ddp-exporter run`` puts first on the job's ``PYTHONPATH`` (its sitecustomize)."""
