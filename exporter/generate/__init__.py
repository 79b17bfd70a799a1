"""Write and check every generated file: the mixin, its deployments and the reference pages.

``ddp-exporter mixin generate|check`` (:mod:`exporter.generate.command`) lists the files
(:mod:`exporter.generate.files`) that :mod:`exporter.mixin`, :mod:`exporter.deploy` and
:mod:`exporter.docsite` render from one configuration.
"""
