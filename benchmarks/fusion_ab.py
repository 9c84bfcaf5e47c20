"""The fused-ops A/B of `benchmarks/run_gpu.sh fusion`: two B1 results of the same commit,
one with the plugin's fusions off (HAL_CUDA_UNFUSE=all), one with them on, side by side.

    python benchmarks/fusion_ab.py UNFUSED.json FUSED.json OUT.json

OUT.json holds both runs' decode ms/step and TTFT (medians and every iteration) and what the
fusions saved (unfused minus fused: positive is faster). It only reads the two results.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

FIGURES = ("decode_ms_per_step", "ttft_ms")


@dataclass(frozen=True)
class FusionAB:
    workload: str
    commit: str
    device: str
    unfused: dict[str, Any]
    fused: dict[str, Any]
    decode_ms_saved: float
    ttft_ms_saved: float
    decode_ratio: float  # fused over unfused ms/step


def compare(unfused: dict[str, Any], fused: dict[str, Any]) -> FusionAB:
    for name, result in (("unfused", unfused), ("fused", fused)):
        if result.get("workload") != "B1" or not all(f in result.get("figures", {})
                                                      for f in FIGURES):
            raise ValueError(f"the {name} result is not a complete B1 result")
    if unfused.get("commit") != fused.get("commit"):
        raise ValueError(f"the two runs measured different commits: {unfused.get('commit')} "
                         f"and {fused.get('commit')}")

    def figures(result: dict[str, Any]) -> dict[str, Any]:
        keep = (*FIGURES, *(f"{f}_all" for f in FIGURES), "roofline_fraction")
        return {k: result["figures"][k] for k in keep if k in result["figures"]}

    a, b = unfused["figures"], fused["figures"]
    return FusionAB(
        workload="B1 fused ops A/B", commit=str(fused.get("commit")),
        device=str(fused.get("device")), unfused=figures(unfused), fused=figures(fused),
        decode_ms_saved=a["decode_ms_per_step"] - b["decode_ms_per_step"],
        ttft_ms_saved=a["ttft_ms"] - b["ttft_ms"],
        decode_ratio=b["decode_ms_per_step"] / a["decode_ms_per_step"])


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    results = []
    for path in argv[:2]:
        with open(path, encoding="utf-8") as f:
            results.append(json.load(f))
    ab = compare(*results)
    with open(argv[2], "w", encoding="utf-8") as f:
        json.dump(asdict(ab), f, indent=1)
        f.write("\n")
    print(f"[fusion] B1 decode {ab.unfused['decode_ms_per_step']:.3f} ms/step unfused, "
          f"{ab.fused['decode_ms_per_step']:.3f} fused ({ab.decode_ms_saved:+.3f} ms saved); "
          f"TTFT {ab.unfused['ttft_ms']:.1f} -> {ab.fused['ttft_ms']:.1f} ms; wrote {argv[2]}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
