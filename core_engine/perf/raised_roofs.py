"""A run's roofs only go up: a step that beats a roof raises it, in the run and in the cache.

A roof measured on a busy host reads low (171 GFLOP/s cached in a busy minute, 414 on a quiet one), and
a step that then runs at 1.4x it says nothing about the step. Since a roof is the best the machine was
seen to do, a step faster than it is such a sighting: the compute roof is raised to the step's FLOP/s,
the memory roof to its bytes/s, whichever it beat, by any margin. The metrics summary is computed
against the roofs the run ended with, so no step's fraction is above 1.

The cache keeps a raised compute roof; a raised memory roof only where the step's weights do not fit in
the last-level cache (a model that fits streams from the cache, not memory: that run's roof, not the
machine's). Only measured roofs are raised: a datasheet's, a recording's or a what-if's are left as is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from batchtop.core_engine.perf.device_peaks import DevicePeaks, last_level_cache_bytes, raise_cached, roofs_file
from batchtop.core_engine.perf.isa_peak import IsaPeak, highest, isa_peaks
from batchtop.core_engine.perf.kernel_peaks import compute_kernels
from batchtop.core_engine.perf.roof_sources import roof_source, with_raise

Persist = Callable[[float, float], object]  # (compute FLOP/s, memory bytes/s) to keep in the cache


@dataclass(frozen=True, slots=True)
class RoofOrigin:
    """One roof: its figure now, what measured it, and the step of this run that last raised it."""

    value: float
    source: str  # the measurement's words, with a raise an earlier run cached
    measured: float  # the figure this run started from
    raised_step: int | None = None
    raised_t_s: float | None = None

    def text(self) -> str:
        """"measured:... (cached) / raised by step 812 at t=3.2 s": where the figure came from."""
        if self.raised_step is None:
            return self.source
        return f"{self.source} / raised {self.raise_words()}"

    def raise_words(self) -> str:
        return f"by step {self.raised_step} at t={self.raised_t_s:.1f} s"

    def as_dict(self) -> dict:
        return {"value": self.value, "source": self.text(), "measured": self.measured,
                "raised_by_step": self.raised_step, "raised_at_s": self.raised_t_s}


def step_rates(snap: object) -> tuple[float, float] | None:
    """(FLOP/s, bytes/s) of a step's forward, as the metrics fold them; None for no device work."""
    cost = snap.cost
    if not snap.is_step or snap.forward_s <= 0 or cost.bytes <= 0:
        return None
    return cost.flops / snap.forward_s, cost.bytes / snap.forward_s


def memory_roof_at_least(bytes_per_s: float, flops: float, intensity: float) -> float:
    """bytes_per_s, nudged up by rounding so that the roof at the step's intensity is not below its
    FLOP/s: the fraction the metrics compute (flops / (B x intensity)) then reads 1, not 1.0000000000000002."""
    while bytes_per_s * intensity < flops:
        bytes_per_s = math.nextafter(bytes_per_s, math.inf)
    return bytes_per_s


def cache_persist(device: str, dtype: str) -> Persist:
    """Raises into this device's and dtype's cached roofs (the identity they were measured under now)."""
    path, identity = roofs_file(device, dtype)
    return lambda flops, bytes_per_s: raise_cached(path, identity, flops, bytes_per_s)


class RoofRaiser:
    """A run's roofs, each raised by the steps that beat it: what the summary's fractions are against."""

    def __init__(self, peaks: DevicePeaks, *, persist: Persist | None = None,
                 compute_kernels_run: tuple[str, ...] = (), isa: dict[str, IsaPeak] | None = None) -> None:
        """persist: where a raise is kept beyond the run (cache_persist; None: the run only).
        compute_kernels_run: the GEMM kernels the compute roof is the fastest of, for their ISA peaks;
        isa: those peaks as already known (a replay: the recording machine's)."""
        self.start = peaks
        self._raisable = self.applies(peaks)
        self.compute = RoofOrigin(peaks.peak_flops, roof_source(peaks.source, "compute"), peaks.peak_flops)
        self.memory = RoofOrigin(peaks.peak_bytes_per_s, roof_source(peaks.source, "memory"), peaks.peak_bytes_per_s)
        self._persist = persist
        self.isa = isa if isa is not None else isa_peaks(compute_kernels_run) if compute_kernels_run else {}

    @classmethod
    def for_run(cls, peaks: DevicePeaks, device: str, dtype: str) -> RoofRaiser:
        """A run's roofs from device_peaks: raises kept in its cache, the ISA peaks of its CPU kernels."""
        if not cls.applies(peaks):
            return cls(peaks)
        kernels = compute_kernels(device, dtype) if device == "cpu" else ()
        return cls(peaks, persist=cache_persist(device, dtype), compute_kernels_run=kernels)

    @staticmethod
    def applies(peaks: DevicePeaks | None) -> bool:
        """Whether these roofs were measured (a datasheet's are not raised)."""
        return peaks is not None and peaks.source.startswith("measured:")

    @property
    def raised(self) -> bool:
        return self.compute.raised_step is not None or self.memory.raised_step is not None

    @property
    def peaks(self) -> DevicePeaks:
        """The roofs now, the source saying which a step raised."""
        if not self.raised:
            return self.start
        source = self.start.source
        for roof, origin in (("compute", self.compute), ("memory", self.memory)):
            if origin.raised_step is not None:
                source = with_raise(source, roof, origin.raise_words())
        return replace(self.start, peak_flops=self.compute.value, peak_bytes_per_s=self.memory.value, source=source)

    def observe(self, snap: object) -> str | None:
        """After each step: raise what it beat; a note saying so, None where it was under its roofs."""
        rates = step_rates(snap) if self._raisable else None
        if rates is None:
            return None
        flops, bytes_per_s = rates
        step, t = snap.step, snap.t
        said = []
        if flops > self.compute.value:
            self.compute = replace(self.compute, value=flops, raised_step=step, raised_t_s=t)
            said.append(f"compute to {flops / 1e9:.3g} GFLOP/s")
        if bytes_per_s > self.memory.value:
            bytes_per_s = memory_roof_at_least(bytes_per_s, flops, snap.cost.flops / snap.cost.bytes)
            self.memory = replace(self.memory, value=bytes_per_s, raised_step=step, raised_t_s=t)
            said.append(f"memory to {bytes_per_s / 1e9:.3g} GB/s")
        if not said:
            return None
        self._keep(snap, flops, bytes_per_s)
        return f"step {step} beat the roofs: raised {' and '.join(said)}"

    def _keep(self, snap: object, flops: float, bytes_per_s: float) -> None:
        """The raise into the cache: compute always, memory where the weights streamed from memory."""
        if self._persist is None:
            return
        llc = last_level_cache_bytes()
        from_memory = llc is None or snap.cost.weight_bytes > llc
        try:
            self._persist(flops, bytes_per_s if from_memory else 0.0)
        except (OSError, ValueError):  # a cache that cannot be written never stops the run
            pass

    def as_dict(self) -> dict:
        """The JSON's "roofs": each roof's figure and where it came from; the ISA peak beside compute."""
        compute = self.compute.as_dict()
        if self.isa:
            top = highest(self.isa)
            compute["isa_peak"] = top.as_dict(self.compute.measured) if top is not None else None
            compute["isa_peaks"] = {kernel: p.as_dict() for kernel, p in self.isa.items()}
        return {"compute": compute, "memory": self.memory.as_dict()}

    def lines(self) -> list[str]:
        """What the Device panel adds under the roofs: which a step raised, the ISA peak beside compute."""
        raised = [f"{roof} {origin.text().rsplit(' / raised ', 1)[1]}"
                  for roof, origin in (("compute", self.compute), ("memory", self.memory))
                  if " / raised " in origin.text()]
        out = [f"raised {' · '.join(raised)}"] if raised else []
        top = highest(self.isa)
        if top is not None:
            out.append(top.text() + (f"; {note}" if (note := top.beside(self.compute.measured)) else ""))
        return out
