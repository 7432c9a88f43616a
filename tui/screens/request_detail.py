"""One request up close: where it is now, its prompt and its output, streaming as the engine runs.

Opened from the Slots panel (enter on the selected slot, or a click). It follows the request, not the
slot: after the request finishes (or is preempted) its text stays, from the frame's TextBook.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from batchtop.core_engine.engine.snapshot import SlotView, StepSnapshot
from batchtop.core_engine.sched.request import Phase
from batchtop.core_engine.engine.detokenizer import RequestText
from batchtop.core_engine.run.frame import DashboardFrame
from batchtop.tui.widgets.engine.slots import progress

REFRESH_S = 0.2
NO_TOKENIZER = "No text: this model has no tokenizer. Run a model directory (--model DIR) to see words here."
NOT_RECORDED = "No text in this recording: record with --record-text to replay what was said."
FORGOTTEN = "Its text is no longer kept: the dashboard keeps the last 64 finished requests' text."


def where(snap: StepSnapshot | None, index: int) -> str:
    """The request's place in the engine at this frame."""
    if snap is not None:
        for slot in snap.slots:
            if slot.index == index:
                done, total = progress(slot)
                if slot.phase is Phase.FINISHED:
                    return f"finished in this step: {done}/{total} tokens, slot {slot.slot} and its KV blocks freed"
                return f"slot {slot.slot} · {slot.phase.value} {done}/{total}"
        for position, waiting in enumerate(snap.waiting):
            if waiting.index == index:
                return f"waiting, #{position + 1} in the queue"
    return "done: no longer in a slot"


def cached_line(slot: SlotView) -> str:
    """How much of the request's KV came from the prefix cache at its (latest) admission."""
    cached, prompt = slot.num_cached, slot.prompt_len
    line = f"prefix cache: {min(cached, prompt)} of its {prompt} prompt tokens were cached, not computed"
    if cached > prompt:  # a preempted request finds its output's blocks again too
        line += f" (and {cached - prompt} output tokens, found again after a preemption)"
    return line


class RequestScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,enter,q", "dismiss", "close"), Binding("p", "app.save_svg", "screenshot")]

    def __init__(self, index: int, request_id: str) -> None:
        super().__init__()
        self.index = index
        self.request_id = request_id
        self._shown: tuple | None = None
        self._cached: str | None = None  # the latest cache line seen, kept once the request leaves its slot

    def compose(self) -> ComposeResult:
        with Vertical(id="request-detail"):
            yield Static(id="request-head")
            with VerticalScroll(id="request-body"):
                yield Static(id="request-text")

    def on_mount(self) -> None:
        self.query_one("#request-detail").border_title = f"request {self.request_id}"
        self.query_one("#request-detail").border_subtitle = "escape: close"
        self.show(self.app.source.frame)
        self.set_interval(REFRESH_S, lambda: self.show(self.app.source.frame))

    def show(self, frame: DashboardFrame) -> None:
        text = frame.texts.get(self.index)
        head = where(frame.snapshot, self.index)
        slot = next((s for s in frame.snapshot.slots if s.index == self.index), None) if frame.snapshot else None
        if slot is not None:
            self._cached = cached_line(slot)
        if self._cached is not None:
            head += "\n" + self._cached
        if (head, text, bool(frame.texts)) == self._shown:
            return
        self._shown = (head, text, bool(frame.texts))
        self.query_one("#request-head", Static).update(Text(head, style="bold"))
        body = self.query_one("#request-body", VerticalScroll)
        following = body.scroll_y >= body.max_scroll_y  # at the end: keep following the output
        self.query_one("#request-text", Static).update(self.body(text, bool(frame.texts)))
        if following:
            self.call_after_refresh(body.scroll_end, animate=False)

    def body(self, text: RequestText | None, any_text: bool) -> Text:
        if text is None:
            missing = FORGOTTEN if any_text else NO_TOKENIZER if self.app.source.info.live else NOT_RECORDED
            return Text(missing, style="italic")
        out = Text()
        out.append("prompt\n", style="bold underline")
        out.append(text.prompt + "\n\n")
        out.append("output\n", style="bold underline")
        out.append(text.output or "…", style="bold")
        return out
