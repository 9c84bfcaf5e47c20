"""`tessera bench` dispatches to every benchmark and refuses unknown ones."""

from __future__ import annotations

import importlib

import pytest

from tessera.benchmarks import cli


def test_every_benchmark_resolves() -> None:
    for module, func in cli.BENCHES.values():
        assert callable(getattr(importlib.import_module(module), func))


def test_help_and_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "serving" in capsys.readouterr().out
    assert cli.main(["nope"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["serving", "offline", "latency", "c1", "peer"])
def test_each_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage: tessera bench" in capsys.readouterr().out
