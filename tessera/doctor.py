"""`tessera doctor`: the HAL's pre-flight check (hal/doctor.py) plus what the engine can load —
the model types it serves and where `--model org/name` looks for cached models."""

from __future__ import annotations

from tessera.hal.doctor import Row
from tessera.hal.doctor import main as hal_main


def model_rows() -> list[Row]:
    from tessera.formats.config import SUPPORTED_ARCHS
    from tessera.formats.hf_cache import hub_cache_dir
    from tessera.worker_proc.models import registered_models

    models = registered_models()
    rows = [Row("model types", "ok", ", ".join(sorted(models)))]
    unrunnable = sorted(set(SUPPORTED_ARCHS) - set(models))
    if unrunnable:
        rows.append(Row("model registry", "FAIL", f"config readers without an implementation: "
                                                  f"{', '.join(unrunnable)}"))
    rows.append(Row("HF cache", "info", f"{hub_cache_dir()} (--model org/name is looked up "
                                        f"here; nothing is downloaded)"))
    return rows


def main(argv: list[str]) -> int:
    return hal_main(argv, extra=model_rows)
