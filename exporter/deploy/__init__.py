"""Generate what deploys the monitoring: the compose stack, Kubernetes, shards, Alertmanager.

Each generator reads the mixin's rules and dashboards (:mod:`exporter.mixin`) and one
:class:`~exporter.mixin.config.MixinConfig`; ``ddp-exporter mixin generate`` writes them
(:mod:`exporter.generate`).
"""
