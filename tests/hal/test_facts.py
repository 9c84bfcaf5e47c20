"""What a run manifest records of the plugin (hal/facts.py): asked of the plugin, never of a
list of chip names kept elsewhere."""

from __future__ import annotations

from typing import ClassVar

import pytest

from tessera.hal.cpu import CpuPlatform
from tessera.hal.facts import platform_facts


class Declaring(CpuPlatform):
    environment_variables: ClassVar[tuple[str, ...]] = ("TESSERA_TEST_CHIP_SELECT",
                                                        "TESSERA_TEST_CHIP_UNSET")

    def versions(self) -> dict[str, str]:
        return {"chiplib": "1.2.3", "driver": "7"}


def test_the_plugin_s_environment_and_library_versions_are_recorded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_TEST_CHIP_SELECT", "0,1")
    monkeypatch.delenv("TESSERA_TEST_CHIP_UNSET", raising=False)
    monkeypatch.setenv("TESSERA_TEST_NOT_DECLARED", "x")
    facts = platform_facts(Declaring())
    plugin = facts["plugin"]
    assert plugin["environment"] == {"TESSERA_TEST_CHIP_SELECT": "0,1"}
    assert plugin["reported"]["chiplib"] == "1.2.3" and facts["devices"]["driver"] == "7"
    assert facts["devices"]["count"] == Declaring().device_count()
