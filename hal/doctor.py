"""`tessera doctor`: the pre-flight check of the hardware side.

Lists the plugins found (and why one that fails to import fails: its traceback's last line),
loads the selected one, and checks devices, memory, library versions, the op table (native,
declared reference fallback, or missing), a smoke run of a few ops against the reference and
communicator set-up. Prints one table; exits non-zero if any check failed.

`--bisect-capture` adds a row per op of a step captured alone and replayed
(hal/bisect_capture.py): the first failing op is where a graph-capture failure comes from.
"""

from __future__ import annotations

import argparse
import platform as pyplatform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

Status = Literal["ok", "warn", "FAIL", "info"]


@dataclass
class Row:
    check: str
    status: Status
    detail: str


def main(argv: list[str], extra: Callable[[], list[Row]] | None = None) -> int:
    """`extra` adds the rows of checks outside the HAL (`tessera doctor` adds the models)."""
    parser = argparse.ArgumentParser(prog="tessera doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--hal", default=None,
                        help="plugin to check (default: TESSERA_HAL, else the best available)")
    parser.add_argument("--bisect-capture", action="store_true",
                        help="capture each op of a step alone and replay it, to find the first "
                             "that fails under graph capture (docs/troubleshooting.md, T106)")
    args = parser.parse_args(argv)
    rows = run_checks(args.hal, bisect=args.bisect_capture)
    if extra is not None:
        rows += extra()
    print(render(rows))
    failed = [r for r in rows if r.status == "FAIL"]
    if failed:
        print(f"\ndoctor: {len(failed)} problem(s) — see the FAIL rows above", file=sys.stderr)
        return 1
    print("\ndoctor: all checks passed")
    return 0


def run_checks(hal: str | None, bisect: bool = False) -> list[Row]:
    import torch  # noqa: F401  (a broken torch install should fail here, plainly)

    rows = _version_rows()
    rows += _plugin_rows()
    platform, row = _load_selected(hal)
    rows.append(row)
    if platform is None:
        return rows
    checks = [_platform_rows, _op_rows, _smoke_rows, _communicator_rows]
    if bisect:
        checks.append(bisect_rows)
    for check in checks:
        try:
            rows += check(platform)
        except Exception as e:  # a check that crashes is itself a finding, not a doctor crash
            from tessera.hal.registry import error_line

            rows.append(Row(check.__name__.strip("_").replace("_rows", ""), "FAIL",
                            error_line(e)))
    return rows


def render(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  status  detail", f"{'-' * width}  ------  {'-' * 40}"]
    lines += [f"{r.check:<{width}}  {r.status:<6}  {r.detail}" for r in rows]
    return "\n".join(lines)


# --- the checks --------------------------------------------------------------------------------
def _pkg_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _driver_version() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
    except OSError:
        return "no NVIDIA driver"
    words = first.split()
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..."
    return next((w for w in words if w.count(".") >= 1 and w[0].isdigit()), first.strip())


def _version_rows() -> list[Row]:
    import torch

    return [
        Row("python", "info", pyplatform.python_version()),
        Row("tessera", "info", _pkg_version("tessera")),
        Row("torch", "info", torch.__version__),
        Row("triton", "info", _pkg_version("triton")),
        Row("cuda runtime", "info", str(torch.version.cuda or "none (cpu build of torch)")),
        Row("driver", "info", _driver_version()),
    ]


def _plugin_rows() -> list[Row]:
    from tessera.hal.registry import survey_plugins

    rows = []
    for s in survey_plugins():
        where = f"{s.spec.origin}, {s.spec.target}"
        if s.error is not None:
            # The selected plugin's failure is reported (as FAIL) by the selection row.
            rows.append(Row(f"plugin {s.spec.name}", "warn",
                            f"import failed: {s.error} ({where})"))
        else:
            state = "available" if s.available else "installed, no usable device here"
            rows.append(Row(f"plugin {s.spec.name}", "ok", f"{state} ({where})"))
    if not rows:
        rows.append(Row("plugins", "FAIL", "no HAL plugin installed"))
    return rows


def _load_selected(hal: str | None) -> tuple[Any, Row]:
    from tessera.hal.errors import HalError
    from tessera.hal.registry import error_line, load_platform, resolve_plugin_name

    explicit, how = resolve_plugin_name(hal)
    try:
        platform = load_platform(hal)
    except HalError as e:
        return None, Row("selected plugin", "FAIL", str(e))
    except Exception as e:
        return None, Row("selected plugin", "FAIL", f"{explicit or 'best'}: {error_line(e)}")
    return platform, Row("selected plugin", "ok", f"{platform.name} (by {how})")


def bisect_rows(platform: Any) -> list[Row]:
    """One row per op captured alone (`--bisect-capture`), and which failed first."""
    from tessera.codes import GRAPH_CAPTURE_FAILED, coded
    from tessera.hal.bisect_capture import bisect_capture

    if not platform.capabilities.graph_capture:
        return [Row("bisect-capture", "info", f"{platform.name} captures no graphs: steps run "
                                              f"eagerly, nothing to bisect")]
    results = bisect_capture(platform)
    rows = [Row(f"capture {r.op}", "ok" if r.ok else "FAIL", r.detail) for r in results]
    first = next((r for r in results if not r.ok), None)
    rows.append(Row("bisect-capture", "ok", "every op captures and replays") if first is None
                else Row("bisect-capture", "FAIL", f"first op that fails under capture: "
                                                   f"{first.op}" + coded(GRAPH_CAPTURE_FAILED)))
    return rows


def _platform_rows(platform: Any) -> list[Row]:
    from tessera.hal.platform import HAL_API_VERSION

    caps = platform.capabilities
    rows = [
        Row("HAL API", "ok", f"plugin targets v{platform.hal_api_version}, "
                             f"tessera implements v{HAL_API_VERSION}"),
        Row("capabilities", "info",
            f"graph capture {'yes' if caps.graph_capture else 'no (eager)'}, dtypes "
            f"{'/'.join(caps.dtypes)} (default {caps.default_dtype}), communicator "
            f"{'/'.join(caps.communicator_backends) or 'none'}"),
    ]
    count = platform.device_count()
    status: Status = "ok" if count >= 1 else "FAIL"
    rows.append(Row("devices", status, f"{count} visible, rank 0 on {platform.device(0)}"))
    free, total = platform.mem_get_info()
    mem_status: Status = "ok" if 0 < free <= total else "FAIL"
    rows.append(Row("memory", mem_status, f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} "
                                          f"GiB"))
    for name, value in getattr(platform, "versions", dict)().items():
        rows.append(Row(f"{platform.name} {name}", "info", value))
    return rows


def _op_rows(platform: Any) -> list[Row]:
    from tessera.hal.ops import OP_NAMES

    fallbacks = set(getattr(platform, "reference_fallbacks", ()))
    rows = []
    for name in OP_NAMES:
        try:
            platform.op(name)
        except NotImplementedError as e:
            rows.append(Row(f"op {name}", "FAIL", str(e)))
            continue
        if name in fallbacks and getattr(platform, "op_source", lambda n: "")(name) != "native":
            rows.append(Row(f"op {name}", "ok", "reference fallback (declared by the plugin)"))
        else:
            rows.append(Row(f"op {name}", "ok", "native"))
    return rows + _fused_rows(platform) + _scheme_rows(platform)


def _fused_rows(platform: Any) -> list[Row]:
    """One row per fused op: the plugin's kernel, or composed by the worker (not a failure:
    fused ops are optional, and a plugin may turn its own off)."""
    from tessera.hal.ops import FUSED_OP_NAMES

    fused_op = getattr(platform, "fused_op", lambda name: None)
    return [Row(f"op {name}", "info", "fused, native" if fused_op(name) is not None
                else "fused op not registered: the worker composes the plain ops")
            for name in FUSED_OP_NAMES]


def _scheme_rows(platform: Any) -> list[Row]:
    """One row per quantization scheme: native kernel, declared reference, or not run."""
    from tessera.hal.quant.weight import SCHEMES

    source = getattr(platform, "scheme_source", None)
    rows = []
    for scheme in SCHEMES:
        how = source(scheme) if source is not None else (
            "native" if scheme in platform.capabilities.quant_schemes else "missing")
        detail = {"native": "native", "reference": "reference fallback (declared by the plugin)",
                  "missing": "not run: --quantization none dequantizes such weights at load"
                  }[how]
        rows.append(Row(f"linear {scheme}", "info" if how == "missing" else "ok", detail))
    return rows


def _smoke_rows(platform: Any) -> list[Row]:
    """rms_norm and greedy sampling on tiny inputs, compared with the reference."""
    import torch

    from tessera.hal.conformance_data import sampling_params
    from tessera.hal.reference import reference_op

    dev = platform.device(0)
    x = torch.linspace(-2, 2, 4 * 64).reshape(4, 64)
    w = torch.linspace(0.5, 1.5, 64)
    got = platform.op("rms_norm")(x.to(dev), w.to(dev), 1e-6).cpu()
    want = reference_op("rms_norm")(x, w, 1e-6)
    platform.synchronize()
    rows = []
    if torch.allclose(got.float(), want, atol=1e-4, rtol=1e-4):
        rows.append(Row("smoke rms_norm", "ok", "matches the reference"))
    else:
        rows.append(Row("smoke rms_norm", "FAIL", f"max error "
                                                  f"{(got.float() - want).abs().max():.3g}"))
    logits = torch.eye(3, 17) * 5
    tokens = platform.op("sample")(logits.to(dev), sampling_params(3, dev, temperature=0.0))
    ok = tokens.cpu().tolist() == [0, 1, 2]
    rows.append(Row("smoke sample", "ok" if ok else "FAIL",
                    "greedy picks the argmax" if ok else f"greedy gave {tokens.tolist()}"))
    return rows


def _communicator_rows(platform: Any) -> list[Row]:
    import torch

    dev = platform.device(0)
    x = torch.arange(4.0, device=dev)
    single = platform.create_communicator(0, 1, "")
    ok = torch.equal(single.all_reduce(x.clone()).cpu(), x.cpu())
    single.destroy()
    loop = platform.create_communicator(0, 2, "", loopback=True)
    ok = ok and torch.equal(loop.all_gather(x).cpu(), torch.cat([x.cpu(), x.cpu()]))
    loop.destroy()
    rows = [Row("communicator", "ok" if ok else "FAIL",
                "single-rank and loopback collectives work" if ok else
                "single-rank or loopback collectives returned wrong values")]
    rows += [_backend_row(b) for b in platform.capabilities.communicator_backends]
    return rows


def _backend_row(backend: str) -> Row:
    """Whether this torch build can create a process group of the declared backend."""
    import torch.distributed as dist

    check = f"backend {backend}"
    if not dist.is_available():
        return Row(check, "FAIL", "this torch build has no torch.distributed")
    probe = getattr(dist, f"is_{backend}_available", None)
    if probe is None:
        return Row(check, "info", "declared; torch cannot tell whether it is built in")
    if probe():
        return Row(check, "ok", "available in this torch build (multi-rank tensor parallel)")
    return Row(check, "FAIL", f"torch was built without {backend}: tensor parallelism "
                              f"across processes will not start")
