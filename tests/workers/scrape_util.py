"""Scrape this process's own exporter endpoint over HTTP and keep what the tests check."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict:
    """Return steps, step duration, phase sums, collective counts per pg and op, and errors."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict = {"phases": {}, "collectives": {}, "ops": {}, "errors": 0.0, "sections": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "ddp_steps_total":
                out["steps"] = s.value
            elif s.name == "ddp_step_duration_seconds_sum":
                out["step_sum"] = s.value
            elif s.name == "ddp_step_duration_seconds_count":
                out["step_count"] = s.value
            elif s.name == "ddp_step_phase_seconds_sum":
                out["phases"][s.labels["phase"]] = s.value
            elif s.name == "ddp_collective_duration_seconds_count":
                pg, op = s.labels["pg"], s.labels["op"]
                out["collectives"][pg] = out["collectives"].get(pg, 0.0) + s.value
                out["ops"][op] = out["ops"].get(op, 0.0) + s.value
            elif s.name == "ddp_rank_info":
                out["timing"] = s.labels["comm_timing"]
                out["parallelism"] = s.labels.get("parallelism")
            elif s.name == "ddp_exporter_errors_total":
                out["errors"] += s.value
            elif s.name == "ddp_section_runs_total":
                out["sections"][s.labels["section"]] = s.value
    return out
