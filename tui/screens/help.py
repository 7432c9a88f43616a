"""`?`: what each panel shows, two lines each, and the keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from batchtop.core_engine.sched.policies import mode_names

HELP = """\
# batchtop

**Slots** — one cell per `max_num_seqs` slot: its request, phase (▸ prefill, ● decode, ░ padding,
✓ finished in this step, its KV freed, ‖ idle, · empty) and progress; with a model directory, the end
of its output text. Red cells are *bubbles*: slots doing no useful work while requests wait. Every
panel shows the same moment: the end of the newest step.

**Slots timeline** (`v`) — rows are slots, columns recent steps, coloured by request. Static batching
shows one block per batch: a finished row goes on as padding (░, dimmed) until the longest member
ends, then the whole batch refills; continuous batching refills a slot the next step.

**KV blocks** — the paged KV pool, one cell per block (or per group when there are thousands),
coloured by the request that owns it. When free blocks run out, admission stops: usually the real limit.

**Waiting** — the queue in order with prompt length, max_tokens and time waited; the first line says
why the head waits (static batch running, slots full, or KV full). ↺ marks a preempted request.

**Roofline** — each step's arithmetic intensity against this device's memory and compute roofs
(log-log). Left of the ridge decode is memory-bound: one more sequence is nearly free.

**Device** — the device, its roofs and where they come from, and live telemetry (NVML on GPUs).
In a `--simulate` run: the simulated device's memory, KV pool and the calibration in use; panels
whose numbers are modelled say SIMULATED in their titles.

**Metrics** — generated tok/s now and its history, batch size per step, TTFT and TPOT p50/p99,
slot and KV utilisation, preemptions, completed/total.

| key | action |
| --- | --- |
| `s` | next batching policy: {modes} (from the next admission; no request lost) |
| `+` `=` / `-` | raise / lower max_num_seqs by one |
| `]` / `[` | double / halve max_num_seqs |
| `space` | pause / resume the engine; `n` runs one step while paused |
| `b` | inject a burst of requests; `r` restarts the workload |
| `v` | Slots grid / timeline; `t` next theme; `p` save an SVG screenshot; `q` quit |
| arrows, `enter` | pick a slot and open its request: prompt and output, streaming (or click a slot) |
| replay | `space` pause, `<` `>` slower / faster, `n` next step, `g` / `G` start / end |
| `--simulate` | `<` `>` simulated time slower / faster against wall time (0.25x .. 1024x, then max) |

Press `escape` or `?` to close; `p` saves this screen as an SVG.
"""


class HelpScreen(ModalScreen[None]):
    # a modal screen takes every key: the screenshot key must work here too (it saves this screen)
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close"), Binding("p", "app.save_svg", "screenshot")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Markdown(HELP.replace("{modes}", " / ".join(mode_names())))
