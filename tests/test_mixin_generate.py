"""Test the generator's command line: generate, --fast, and check against the committed files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.generate.files import generated_files
from exporter.mixin import DEFAULT, FAST
from exporter.mixin.__main__ import REPO_ROOT, apply_overrides, check, main
from exporter.mixin.render import GENERATED_BY
from exporter.tools.cli import build_parser


@pytest.mark.tool
def test_check_passes_on_the_committed_files() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.mixin", "check"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr


@pytest.mark.unit
def test_check_fails_with_a_diff_when_a_file_is_stale(tmp_path: Path) -> None:
    for rel in generated_files(DEFAULT, build_parser()):
        dest = tmp_path / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, dest)
    rules = tmp_path / "dashboards/prometheus/rules.yml"
    rules.write_text(rules.read_text().replace("for: 5m", "for: 7m", 1))
    (tmp_path / "docs/runbook.md").unlink()
    diffs = check(tmp_path)
    assert len(diffs) == 2
    assert any("-    for: 7m" in d and "+    for: 5m" in d for d in diffs)
    assert any("docs/runbook.md" in d for d in diffs)


@pytest.mark.unit
def test_generate_writes_every_file(tmp_path: Path, capsys) -> None:
    assert main(["generate", "--out", str(tmp_path)]) == 0
    for rel, text in generated_files(DEFAULT, build_parser()).items():
        assert (tmp_path / rel).read_text() == text
    assert (tmp_path / "docker-compose.yml").exists()
    assert (tmp_path / "docs/runbook.md").exists()
    assert len(list((tmp_path / "dashboards/grafana").glob("*.json"))) == 7
    assert str(tmp_path / "dashboards/prometheus/rules.yml") in capsys.readouterr().out


@pytest.mark.unit
def test_generate_replaces_its_own_files_but_not_a_projects(tmp_path: Path, capsys) -> None:
    """Run in a project's folder (--out defaults to it), it replaced its docker-compose.yml."""
    assert main(["generate", "--out", str(tmp_path), "--fast"]) == 0
    assert main(["generate", "--out", str(tmp_path)]) == 0  # its own files, regenerated
    compose, runbook = tmp_path / "docker-compose.yml", tmp_path / "docs/runbook.md"
    compose.write_text("services:\n  app:\n    image: mine\n")
    runbook.write_text("# Our on-call runbook\n")
    rules = tmp_path / "dashboards/prometheus/rules.yml"
    rules.unlink()
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main(["generate", "--out", str(tmp_path), "--fast"])
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "holds 2 file(s) it did not write (docker-compose.yml, docs/runbook.md)" in err, err
    assert "--force" in err and not rules.exists()  # nothing written
    assert compose.read_text() == "services:\n  app:\n    image: mine\n"
    assert main(["generate", "--out", str(tmp_path), "--force"]) == 0
    assert GENERATED_BY in compose.read_text() and rules.exists()


@pytest.mark.unit
def test_a_write_that_fails_midway_leaves_every_file_as_it_was(tmp_path: Path, capsys) -> None:
    """Written one by one, a failure on the last file left the others new and itself cut."""
    assert main(["generate", "--out", str(tmp_path), "--fast"]) == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    runbook = tmp_path / "docs/runbook.md"  # the last file written
    runbook.unlink()
    runbook.mkdir()
    capsys.readouterr()
    with pytest.raises(SystemExit) as failed:
        main(["generate", "--out", str(tmp_path)])
    assert failed.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"cannot write {runbook}: " in err, err
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    del before[runbook]
    assert after == before  # nothing replaced, no staging file left


@pytest.mark.unit
def test_generate_fast_renders_shorter_windows(tmp_path: Path) -> None:
    assert main(["generate", "--out", str(tmp_path), "--fast"]) == 0
    rules = (tmp_path / "dashboards/prometheus/rules.yml").read_text()
    assert f"run_rank:ddp_steps:rate{FAST.rate_window}" in rules
    assert f"[{FAST.rate_window}]" in rules
    assert f"run_rank:ddp_steps:rate{DEFAULT.rate_window}" not in rules


@pytest.mark.unit
def test_headers_where_the_format_allows_comments() -> None:
    for rel, text in generated_files(DEFAULT, build_parser()).items():
        if rel.endswith((".yml", ".yaml")):
            assert text.startswith(f"# {GENERATED_BY}\n"), rel
        elif rel.endswith(".md"):
            assert text.startswith(f"<!-- {GENERATED_BY} -->"), rel
        else:
            assert rel.endswith(".json"), rel


@pytest.mark.unit
def test_runbook_has_an_anchor_for_every_alert_link() -> None:
    from exporter.mixin import rules

    runbook = generated_files(DEFAULT)["docs/runbook.md"]
    for alert in rules.every_alert(DEFAULT):
        assert f"\n## {alert.name}\n" in runbook
        assert alert.rule(DEFAULT)["annotations"]["runbook_url"].endswith(f"#{alert.name.lower()}")
    for heading in ("### What it means", "### How to confirm", "### What to do"):
        assert runbook.count(heading) == len(rules.ALERT_NAMES)


@pytest.mark.unit
def test_generate_set_overrides_a_setting(tmp_path: Path) -> None:
    assert (
        main(
            [
                "generate",
                "--out",
                str(tmp_path),
                "--set",
                "stalled_for=7m",
                "--set",
                "straggler_ratio=2",
            ]
        )
        == 0
    )
    rules = (tmp_path / "dashboards/prometheus/rules.yml").read_text()
    assert "for: 7m" in rules and "> 2)" in rules
    assert apply_overrides(DEFAULT, ["timeout_for=1m"]).timeout_for == "1m"
    with pytest.raises(ValueError):
        apply_overrides(DEFAULT, ["no_such_field=1"])
