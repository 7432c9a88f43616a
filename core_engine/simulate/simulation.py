"""One what-if setup: the simulated device, its roofs, the calibration, and engines built on them."""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.perf.device_peaks import DevicePeaks
from batchtop.core_engine.simulate.calibration import Calibration
from batchtop.core_engine.simulate.clock import VirtualClock
from batchtop.core_engine.simulate.simulated_devices import SimulatedDevice
from batchtop.core_engine.simulate.runner import RooflineTimer, SimulatedRunner


@dataclass(frozen=True, slots=True)
class Simulation:
    device: SimulatedDevice
    peaks: DevicePeaks
    calibration: Calibration

    def __post_init__(self) -> None:
        # the efficiencies are shares of the roofs they were fitted against: on the device they were
        # fitted on, time the steps (and draw the panels) by those, not by whatever the cache holds now
        object.__setattr__(self, "peaks", self.calibration.roofs_on(self.peaks))

    @property
    def tag(self) -> str:
        """What screens put beside every modelled number."""
        return f"SIMULATED {self.device.label}"

    def engine(self, config: EngineConfig) -> Engine:
        """The real engine (scheduler, allocator, policies) over a simulated runner and a virtual clock."""
        clock = VirtualClock()
        runner = SimulatedRunner(config, clock, RooflineTimer(self.peaks, self.calibration,
                                                          config.model.num_hidden_layers))
        return Engine(config, runner=runner, clock=clock)

    def as_dict(self) -> dict:
        """The metrics JSON's "simulated" record."""
        return {"device": self.device.label, "name": self.device.name, "memory_bytes": self.device.memory,
                "peaks_source": self.peaks.source, "peaks": self.peaks.as_dict(),
                "calibration": self.calibration.as_dict()}

    def lengths_note(self, config: EngineConfig) -> str | None:
        """What a start-up note says when the model has an EOS that a what-if run never produces."""
        if not config.model.eos_token_ids:
            return None  # a random-weight preset: lengths follow max_tokens on a real run too
        return (f"{config.model.name}'s EOS is not simulated (no model runs, so no answer ends on its own): "
                f"every request runs to its max_tokens")

    def mismatch(self) -> str | None:
        """A warning when the calibration was fitted on another device or model than this run's."""
        fitted = self.calibration.fitted_on.get("device")
        # a GPU's own name ("NVIDIA H100 80GB HBM3") contains its datasheet entry ("H100")
        if fitted and self.peaks.device_name.lower() not in str(fitted).lower():
            return f"the calibration was fitted on {fitted}, this run simulates {self.peaks.device_name}"
        return None
