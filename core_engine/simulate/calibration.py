"""The five constants that turn a step's FLOPs and bytes into seconds, and the file that holds them.

    matmul time    = max(weight FLOPs / (peak FLOP/s x compute_efficiency),
                         (bytes - KV bytes) / (peak B/s x memory_efficiency))
    attention time = max(attention FLOPs / (peak FLOP/s x compute_efficiency),
                         KV bytes / (peak B/s x attention_efficiency))
    step time      = matmul time + attention time + layers x layer_latency_s + step_overhead_s

(the GEMMs and attention are separate kernels, one after the other: core_engine.measure.roofline).
The GEMMs stream their weights front to back; the attention kernels gather each row's KV blocks from
the pool, so the bandwidth each reaches is its own constant.

The per-layer latency is the time each decoder layer costs a step whatever its bytes (kernel launches,
small ops): what makes a small model's short steps slower than its roofs, without an efficiency above 1.

The defaults describe a GPU serving stack: decode kernels stream weights at ~80% of HBM bandwidth,
FlashAttention-class decode kernels stream KV near HBM bandwidth too (also 0.8), large bf16 GEMMs
reach ~60% of the dense tensor-core peak, and a Python engine loop (scheduling, input building,
sampling, launches) costs a few milliseconds per step.
`batchtop calibrate -o FILE` fits them to a measured decode sweep instead, each efficiency at most 1.

A file written before attention_efficiency existed (same schema, three constants) still loads: its
KV read was charged at its memory_efficiency, so that is its attention_efficiency. One written before
layer_latency_s loads with 0 for it; one with an efficiency above 1 (fitted before they were bounded)
loads too, and describe() says so.

The efficiencies are shares of the roofs they were fitted against (the file's `fitted_on.peaks`), not of
whatever the device's roof cache holds later: that cache is measured again and raised by runs, and the
same efficiencies on other roofs predict other times. A what-if run of the device a calibration was
fitted on times its steps by the calibration's roofs (roofs_on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from batchtop.core_engine.model.cost import StepCost
from batchtop.core_engine.errors import ConfigError
from batchtop.core_engine.perf import roofline
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.text_files import NotText, input_problem, parse_json, read_text_file

CALIBRATION_SCHEMA = "batchtop.calibration/1"
CONSTANTS = ("compute_efficiency", "memory_efficiency", "attention_efficiency", "step_overhead_s", "layer_latency_s")
EFFICIENCIES = CONSTANTS[:3]
ADDED = "attention_efficiency"  # absent from the files written before it: read as their memory_efficiency
OPTIONAL = {"layer_latency_s": 0.0}  # absent from the files written before it: no per-layer term
# What a file may hold. An efficiency is a share of the peak: `calibrate` searches 0.01..1 now, and
# searched up to 100 before (files with a fit above 1 still load, with a note); outside 0.01..100 a
# value is a typo, and one like 1e-320 turns every step into an infinite time. A step's host overhead
# is above 0 and at most an hour: 1e308 overflows the simulated clock.
EFFICIENCY_RANGE = (0.01, 100.0)
FITTED_RANGE = (0.01, 1.0)  # what `calibrate` writes now: no kernel runs above the roofs the device measured
MAX_OVERHEAD_S = 3600.0
MAX_LAYER_LATENCY_S = 1.0  # one decoder layer's fixed cost per step; past a second it is a typo
MAX_CALIBRATION_BYTES = 1 << 20  # `calibrate` writes about 2 KB; past this the file is not one


@dataclass(frozen=True, slots=True)
class Calibration:
    compute_efficiency: float  # share of the peak FLOP/s its GEMMs and attention reach
    memory_efficiency: float  # share of the peak bandwidth its GEMMs' weight and activation traffic reaches
    attention_efficiency: float  # share of the peak bandwidth its attention kernels' KV traffic reaches
    step_overhead_s: float  # host time per step outside the device work
    layer_latency_s: float = 0.0  # per decoder layer per step: launches and small ops, not bytes
    source: str = "defaults"  # "defaults" or the file it was read from
    fitted_on: dict = field(default_factory=dict, compare=False)  # device, model, dtype of the fit
    roofs: DevicePeaks | None = field(default=None, compare=False)  # what the efficiencies are shares of

    def roofs_on(self, peaks: DevicePeaks) -> DevicePeaks:
        """The roofs to time steps by on a device whose roofs are `peaks`: this calibration's own where it
        was fitted on that device (its efficiencies are shares of them), else the device's."""
        if self.roofs is not None and self.roofs.device_name == peaks.device_name:
            return self.roofs
        return peaks

    def device_time(self, cost: StepCost, peaks: DevicePeaks) -> float:
        """The roofline time of a step's device work (its GEMMs, then its attention), at the reachable
        (not the peak) roofs."""
        return roofline.device_time(cost, peaks.peak_flops * self.compute_efficiency,
                                    peaks.peak_bytes_per_s * self.memory_efficiency,
                                    peaks.peak_bytes_per_s * self.attention_efficiency)

    def layers_time(self, layers: int) -> float:
        """The device time a step's decoder layers cost beyond their roofline work."""
        return layers * self.layer_latency_s

    def step_time(self, cost: StepCost, peaks: DevicePeaks, layers: int = 0) -> float:
        """What a what-if run says the step takes: its device work, its layers' latency (a model of
        `layers` decoder layers) and the per-step overhead."""
        return self.step_overhead_s + self.layers_time(layers) + self.device_time(cost, peaks)

    def marginal_sequence_cost(self, cost: StepCost, batch: int, peaks: DevicePeaks, layers: int = 0) -> float:
        """The what-if step time's relative increase from one more sequence like the average one in
        this batch (the Roofline panel's "+1 seq" in a simulated session)."""
        return roofline.one_more_row_increase(cost, batch, lambda c: self.step_time(c, peaks, layers))

    def above_peak(self) -> list[str]:
        """The efficiencies above 1: a file fitted before they were bounded by the device's roofs."""
        return [name for name in EFFICIENCIES if getattr(self, name) > 1.0]

    def constants(self) -> dict:
        return {name: getattr(self, name) for name in CONSTANTS}

    def as_dict(self) -> dict:
        return {**self.constants(), "source": self.source, **({"fitted_on": self.fitted_on} if self.fitted_on else {}),
                **({"roofs": self.roofs.as_dict()} if self.roofs is not None else {})}

    def describe(self) -> str:
        text = (f"compute eff {self.compute_efficiency:.2f} · memory eff {self.memory_efficiency:.2f} · "
                f"attention eff {self.attention_efficiency:.2f} · overhead {1e3 * self.step_overhead_s:.1f} ms · "
                f"{1e6 * self.layer_latency_s:.1f} us/layer ({self.source})")
        above = self.above_peak()
        if above:
            text += (f"; note: {', '.join(f'{n} {getattr(self, n):.2f}' for n in above)} above 1, faster than the "
                     f"device's roofs (fitted before efficiencies were bounded): re-run batchtop calibrate")
        return text


DEFAULT = Calibration(compute_efficiency=0.6, memory_efficiency=0.8, attention_efficiency=0.8, step_overhead_s=0.002)


def constant_problem(name: str, value: float) -> str | None:
    """What is wrong with a constant's value (None: nothing), as load_calibration words it."""
    if name == "layer_latency_s":  # 0: no per-layer term, as before it existed
        if not 0 <= value <= MAX_LAYER_LATENCY_S:
            return f"{name} must be in 0..{MAX_LAYER_LATENCY_S:g} s a layer, got {value!r}"
        return None
    if value <= 0:
        return f"{name} must be > 0, got {value!r}"
    if name == "step_overhead_s":
        ok, span = value <= MAX_OVERHEAD_S, f"at most {MAX_OVERHEAD_S:g} s a step"
    else:
        low, high = EFFICIENCY_RANGE
        ok, span = low <= value <= high, f"in {low:g}..{high:g} (a share of the device's peak)"
    return None if ok else f"{name} must be {span}, got {value!r}"


def load_calibration(path: str) -> Calibration:
    """Read a calibration file; anything unusable is a ConfigError naming the file and the constant."""
    def bad(message: str) -> ConfigError:
        return ConfigError("calibration", f"{path}: {message}")

    p = Path(path)
    problem = input_problem(p, "calibration file")  # anything else is read once as a stream (a FIFO, <(...))
    if problem is not None:
        raise bad(problem)
    try:
        data = parse_json(read_text_file(p, MAX_CALIBRATION_BYTES, "a calibration file"))
    except NotText as exc:
        raise bad(exc.message + (f" at line {exc.line}" if exc.line is not None else "")) from None
    if not isinstance(data, dict):
        raise bad("must be a JSON object with " + ", ".join(name for name in CONSTANTS if name not in OPTIONAL))
    schema = data.get("schema", CALIBRATION_SCHEMA)
    if schema != CALIBRATION_SCHEMA:
        raise bad(f"schema is {schema!r}, expected {CALIBRATION_SCHEMA!r}")
    values = {}
    for name in CONSTANTS:
        if name not in data:
            if name == ADDED or name in OPTIONAL:
                continue
            raise bad(f"{name} is missing")
        value = data[name]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise bad(f"{name} must be a number, got {value!r}")
        problem = constant_problem(name, float(value))
        if problem is not None:
            raise bad(problem)
        values[name] = float(value)
    values.setdefault(ADDED, values["memory_efficiency"])
    for name, absent in OPTIONAL.items():
        values.setdefault(name, absent)
    fitted_on = data.get("fitted_on") if isinstance(data.get("fitted_on"), dict) else {}
    roofs = None
    if fitted_on.get("peaks") is not None:
        roofs = fitted_roofs(fitted_on["peaks"])
        if isinstance(roofs, str):
            raise bad(roofs)
    return Calibration(**values, source=path, fitted_on=fitted_on, roofs=roofs)


def fitted_roofs(data: object) -> DevicePeaks | str:
    """A file's fitted_on.peaks as roofs, or what is wrong with it (load_calibration words it)."""
    if not isinstance(data, dict):
        return f"fitted_on.peaks must be an object (the roofs the constants were fitted against), got {data!r}"
    for name in ("peak_flops", "peak_bytes_per_s"):
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
            return f"fitted_on.peaks.{name} must be a positive number, got {value!r}"
    return DevicePeaks(str(data.get("device_name", "")), float(data["peak_flops"]), float(data["peak_bytes_per_s"]),
                       str(data.get("source", "")))
