"""Hold how often the generated Prometheus scrapes and evaluates, and where the runbook lives."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...version import RUNBOOK_URL
from .domain import Domain, check_durations

__all__ = ["EvaluationConfig"]


@dataclass(frozen=True)
class EvaluationConfig(Domain):
    """Say the scrape and evaluation intervals and the runbook every alert links to."""

    TITLE = "evaluation and deployment"

    #: Scrape interval of the generated Prometheus config ...
    scrape_interval: str = "5s"
    #: ... and its rule evaluation interval.
    evaluation_interval: str = "5s"
    #: Base URL of the generated runbook; each alert links to ``<base>#<anchor>``. The default
    #: is the runbook in the project's repository; point it at your own copy (the generator
    #: writes one, docs/runbook.md) where people on call read it.
    runbook_base_url: str = RUNBOOK_URL

    def validate(self) -> None:
        """Refuse an interval that is not positive, and a runbook that is no http(s) URL."""
        check_durations(self, ("scrape_interval", "evaluation_interval"), positive=True)
        # Every alert's runbook_url annotation is a template: a brace there would start one.
        if not re.fullmatch(r"https?://[^\s{}]+", self.runbook_base_url):
            raise ValueError(
                "runbook_base_url must be an http(s):// URL without spaces or braces: "
                f"{self.runbook_base_url!r}"
            )
