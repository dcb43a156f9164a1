"""The CLI end to end: list and check, and their exit codes."""

from typer.testing import CliRunner

import attnbench
from attnbench.cli import app

runner = CliRunner()


def test_list_shows_every_mechanism():
    result = runner.invoke(app, ["list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for name in attnbench.names():
        assert name in result.output


def test_check_passes_for_a_subset():
    result = runner.invoke(app, ["check", "--attn", "nala,mirrorla,stella"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "agree with their references" in result.output


def test_check_unknown_name_is_a_clear_error():
    result = runner.invoke(app, ["check", "--attn", "nalla"], env={"COLUMNS": "250"})
    assert result.exit_code == 2
    assert "did you mean 'nala'" in result.output


def test_check_reports_a_disagreement(monkeypatch):
    cls = attnbench.get_attention("linear")
    monkeypatch.setattr(cls, "forward_torch", lambda self, q, k, v: cls.forward_reference(self, q, k, v) * 1.01)
    result = runner.invoke(app, ["check", "--attn", "linear"], env={"COLUMNS": "250"})
    assert result.exit_code == 1
    assert "mismatch" in result.output
