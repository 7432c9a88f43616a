"""The devices a what-if run can simulate: every GPU of the datasheet table by a short name, or `cpu`
(this machine, with its measured roofs)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from batchtop.core_engine.device import device_name
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.perf.device_peaks import DATASHEET, DevicePeaks, device_peaks

ALIASES = {"a100-80gb": "A100-SXM4-80GB", "a100-40gb": "A100-SXM4-40GB"}


@dataclass(frozen=True, slots=True)
class SimulatedDevice:
    name: str  # the short name: "h200", "cpu"
    label: str  # what screens and metrics call it: the datasheet entry, or this CPU's model name
    kind: str  # "cuda" or "cpu": whose defaults apply (model, slots, trace scale, KV pool)
    memory: int | None  # bytes a GPU's KV pool is sized from; None: the CPU default pool
    datasheet: DevicePeaks | None  # a GPU's roofs; the CPU's are measured (see peaks())

    def peaks(self, dtype: str) -> DevicePeaks:
        """The roofs every modelled step time divides by."""
        return self.datasheet if self.datasheet is not None else device_peaks("cpu", dtype)


def short_name(fragment: str) -> str:
    return fragment.lower().replace(" ", "-")


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def device_names() -> list[str]:
    return ["cpu", *(short_name(fragment) for fragment, *_ in DATASHEET), *ALIASES]


def simulated_device(name: str) -> SimulatedDevice:
    """A device by its short name (case and punctuation ignored: H100_PCIe, h100-pcie)."""
    key = _key(name)
    if key == "cpu":
        return SimulatedDevice("cpu", device_name("cpu"), "cpu", None, None)
    wanted = next((fragment for alias, fragment in ALIASES.items() if _key(alias) == key), None)
    for fragment, flops, bandwidth, memory in DATASHEET:
        if fragment == wanted or _key(fragment) == key:
            peaks = DevicePeaks(fragment, flops, bandwidth, f"datasheet:{fragment}")
            return SimulatedDevice(short_name(fragment), fragment, "cuda", memory, peaks)
    raise ConfigError("simulate", f"unknown device {name!r} (choose {', '.join(device_names())})")
