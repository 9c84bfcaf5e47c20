from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tessera.hal.cpu.dense import rms_norm
from tessera.hal.cpu.platform import CpuPlatform
from tessera.hal.errors import (
    MissingOpError,
    MissingSchemeError,
    PluginLoadError,
    PluginNotFoundError,
)
from tessera.hal.platform import Capabilities, QuantLinearKernel
from tessera.hal.quant import quant_linear_reference
from tessera.hal.reference import reference_op
from tessera.hal.registry import (
    discover_plugins,
    load_platform,
    select_plugin_class,
    survey_plugins,
)
from tests.hal.fake_plugins import BROKEN, GOOD, OLD_API, install_fake_plugin


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TESSERA_HAL", raising=False)
    return tmp_path


def test_builtins_are_discovered(plugin_dir: Path) -> None:
    plugins = discover_plugins()
    assert plugins["cpu"].target == "tessera.hal.cpu:CpuPlatform"
    assert plugins["cuda"].target == "tessera.hal.cuda:CudaPlatform"
    assert plugins["cpu"].origin == "built-in"


def test_entry_point_plugin_is_discovered_and_selected(plugin_dir: Path) -> None:
    install_fake_plugin(plugin_dir, "fakechip", GOOD)
    spec = discover_plugins()["fakechip"]
    assert spec.origin == "entry point (fake_hal_fakechip 0.1)"
    platform = load_platform("fakechip")
    assert platform.name == "fakechip"


def test_env_var_selects_when_no_name(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_plugin(plugin_dir, "fakechip", GOOD)
    monkeypatch.setenv("TESSERA_HAL", "fakechip")
    assert load_platform().name == "fakechip"
    assert load_platform("cpu").name == "cpu"  # the explicit name wins over the variable


def test_best_available_is_highest_priority(plugin_dir: Path) -> None:
    statuses = [s for s in survey_plugins() if s.available and s.cls is not None]
    best = max(statuses, key=lambda s: getattr(s.cls, "priority", 50))
    assert select_plugin_class(None) is best.cls
    # cpu is always available, so something is always chosen
    assert any(s.spec.name == "cpu" for s in statuses)


def test_missing_plugin_lists_installed(plugin_dir: Path) -> None:
    with pytest.raises(PluginNotFoundError) as info:
        load_platform("nosuch")
    message = str(info.value)
    assert "'nosuch'" in message and "cpu (built-in)" in message and "cuda (built-in)" in message


def test_broken_plugin_is_fatal_when_named_with_its_cause(plugin_dir: Path) -> None:
    install_fake_plugin(plugin_dir, "broken", BROKEN)
    with pytest.raises(PluginLoadError) as info:
        load_platform("broken")
    message = str(info.value)
    assert "RuntimeError: boom: the fake driver is missing" in message
    assert "cpu (built-in)" in message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_broken_plugin_is_reported_not_swallowed_when_not_named(plugin_dir: Path,
                                                                 caplog: Any) -> None:
    install_fake_plugin(plugin_dir, "broken", BROKEN)
    status = next(s for s in survey_plugins() if s.spec.name == "broken")
    assert status.error == "RuntimeError: boom: the fake driver is missing"
    with caplog.at_level("WARNING"):
        assert load_platform().name != "broken"
    assert "boom: the fake driver is missing" in caplog.text


def test_api_version_mismatch_is_refused(plugin_dir: Path) -> None:
    install_fake_plugin(plugin_dir, "oldchip", OLD_API)
    with pytest.raises(PluginLoadError, match="targets HAL API version 0"):
        load_platform("oldchip")


def test_entry_point_name_must_match_platform_name(plugin_dir: Path) -> None:
    install_fake_plugin(plugin_dir, "alias", GOOD.replace('"{name}"', '"cpu"'))
    with pytest.raises(PluginLoadError, match="calls itself 'cpu'"):
        load_platform("alias")


class _TwoOps(CpuPlatform):
    name: ClassVar[str] = "twoops"
    reference_fallbacks: ClassVar[tuple[str, ...]] = ("linear",)

    def register_ops(self) -> dict[str, Callable[..., Any]]:
        return {"rms_norm": rms_norm, "embedding": reference_op("embedding")}


def test_missing_op_names_op_plugin_and_registered() -> None:
    platform = _TwoOps()
    with pytest.raises(MissingOpError) as info:
        platform.op("attention_decode")
    message = str(info.value)
    assert "'attention_decode'" in message and "'twoops'" in message
    assert "embedding, rms_norm" in message


def test_declared_fallback_is_the_reference_and_reported() -> None:
    platform = _TwoOps()
    assert platform.op("linear") is reference_op("linear")
    assert platform.op_source("linear") == "reference"
    assert platform.op_source("rms_norm") == "native"
    assert platform.op_source("sample") == "missing"


def test_unknown_op_registration_is_rejected() -> None:
    class Typo(CpuPlatform):
        name: ClassVar[str] = "typo"

        def register_ops(self) -> dict[str, Callable[..., Any]]:
            return {"rmsnorm": rms_norm}

    with pytest.raises(ValueError, match="unknown ops \\['rmsnorm'\\]"):
        Typo()


class _Fp8Only(CpuPlatform):
    name: ClassVar[str] = "fp8only"
    capabilities: ClassVar[Capabilities] = replace(CpuPlatform.capabilities,
                                                   quant_schemes=("fp8",))
    reference_quant_fallbacks: ClassVar[tuple[str, ...]] = ("int8",)

    def register_quant_linears(self) -> dict[str, QuantLinearKernel]:
        return {"fp8": QuantLinearKernel("fp8", quant_linear_reference)}


def test_quant_scheme_rule_native_reference_or_clear_error() -> None:
    platform = _Fp8Only()
    assert platform.scheme_source("fp8") == "native"
    assert platform.scheme_source("int8") == "reference"
    assert platform.linear_kernel("int8").apply is quant_linear_reference
    assert platform.scheme_source("int4") == "missing"
    with pytest.raises(MissingSchemeError) as info:
        platform.linear_kernel("int4")
    message = str(info.value)
    assert "'int4'" in message and "'fp8only'" in message and "native: fp8" in message
    assert "reference fallbacks: int8" in message and "--quantization none" in message


def test_quant_kernels_must_match_the_declared_schemes() -> None:
    class Undeclared(CpuPlatform):
        name: ClassVar[str] = "undeclared"
        capabilities: ClassVar[Capabilities] = replace(CpuPlatform.capabilities,
                                                       quant_schemes=("fp8", "int4"))

        def register_quant_linears(self) -> dict[str, QuantLinearKernel]:
            return {"fp8": QuantLinearKernel("fp8", quant_linear_reference)}

    with pytest.raises(ValueError, match="declares quant_schemes"):
        Undeclared()


def test_a_plugin_without_quantized_kernels_refuses_every_scheme() -> None:
    class Plain(CpuPlatform):
        name: ClassVar[str] = "plain"
        capabilities: ClassVar[Capabilities] = replace(CpuPlatform.capabilities,
                                                       quant_schemes=())

        def register_quant_linears(self) -> dict[str, QuantLinearKernel]:
            return {}

    with pytest.raises(MissingSchemeError, match="native: none"):
        Plain().linear_kernel("fp8")
