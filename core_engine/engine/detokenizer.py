"""Prompt and output text per request, decoded incrementally while the engine runs.

TextDecoder runs on the engine thread after each step: every running sequence has one incremental
detokenizer (tokenizer.stream), fed only the tokens sampled since the last step, so a step's cost is
its new tokens, never the whole sequence. What it returns, a TextDelta, is what the dashboard's
TextBook adds and what a trace records with --record-text, so a replay grows the same text.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from batchtop.core_engine.sched.request import Sequence
from batchtop.core_engine.engine.snapshot import StepSnapshot
from batchtop.core_engine.model.tokenizer import TextStream, Tokenizer

FINISHED_KEPT = 64  # finished requests whose text stays viewable


@dataclass(frozen=True, slots=True)
class TextDelta:
    """The text one step added: prompts of requests seen for the first time, new output per request."""

    prompts: tuple[tuple[int, str], ...] = ()  # (request index, prompt text)
    outputs: tuple[tuple[int, str], ...] = ()  # (request index, text appended to its output)

    def __bool__(self) -> bool:
        return bool(self.prompts or self.outputs)

    def as_event(self) -> dict:
        return {"type": "text", "prompts": [list(p) for p in self.prompts],
                "outputs": [list(o) for o in self.outputs]}

    @classmethod
    def from_event(cls, event: dict) -> TextDelta:
        return cls(tuple((int(i), str(t)) for i, t in event["prompts"]),
                   tuple((int(i), str(t)) for i, t in event["outputs"]))


class TextDecoder:
    """One incremental detokenizer per live sequence; forgets a sequence once it finishes."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._streams: dict[int, tuple[TextStream, int]] = {}  # index -> (stream, output tokens decoded)
        self._indices: dict[str, int] = {}  # request id -> index, to forget an aborted request

    def update(self, running: Iterable[Sequence], snap: StepSnapshot) -> TextDelta:
        """The text of the tokens sampled in the step that produced snap (or since the last call)."""
        for name, value in snap.controls:
            if name == "reset":  # request indices start again from 0
                self._streams.clear()
                self._indices.clear()
            elif name == "abort" and value in self._indices:
                self._streams.pop(self._indices.pop(value), None)
        prompts: list[tuple[int, str]] = []
        outputs: list[tuple[int, str]] = []
        for seq in running:
            if seq.index not in self._streams:
                self._indices[seq.id] = seq.index
            self._advance(seq.index, seq.request.prompt_token_ids, seq.token_ids, seq.prompt_len, prompts, outputs)
        for done in snap.finished:  # already out of `running`; its last token came this step
            if done.index in self._streams:
                self._advance(done.index, (), done.output_token_ids, 0, prompts, outputs)
                held = self._streams.pop(done.index)[0].flush()
                if held:
                    outputs.append((done.index, held))
                self._indices.pop(done.request_id, None)
        return TextDelta(tuple(prompts), tuple(outputs))

    def _advance(self, index: int, prompt_ids: tuple[int, ...], token_ids: list[int] | tuple[int, ...],
                 output_start: int, prompts: list, outputs: list) -> None:
        """Push token_ids[output_start + tokens already pushed:] (indexed, never copied whole)."""
        entry = self._streams.get(index)
        if entry is None:
            prompts.append((index, self.tokenizer.decode(prompt_ids)))
            entry = (self.tokenizer.stream(prompt_ids), 0)
        stream, done = entry
        total = len(token_ids) - output_start
        if done < total:
            text = "".join(stream.push(token_ids[output_start + i]) for i in range(done, total))
            if text:
                outputs.append((index, text))
        self._streams[index] = (stream, total)


@dataclass(frozen=True, slots=True)
class RequestText:
    prompt: str
    output: str


class TextBook:
    """Every live request's text, plus the last FINISHED_KEPT finished ones; grown by TextDeltas.

    Owned by the thread that builds frames; view() hands the UI an immutable copy."""

    def __init__(self) -> None:
        self._texts: dict[int, RequestText] = {}
        self._finished: OrderedDict[int, None] = OrderedDict()
        self._view: Mapping[int, RequestText] | None = None  # the last copy handed out, while unchanged

    def add(self, delta: TextDelta, finished: Iterable[int] = ()) -> None:
        if delta:
            self._view = None
        for index, prompt in delta.prompts:
            self._texts[index] = RequestText(prompt, "")
        for index, text in delta.outputs:
            old = self._texts.get(index, RequestText("", ""))
            self._texts[index] = RequestText(old.prompt, old.output + text)
        for index in finished:
            self._finished[index] = None
        while len(self._finished) > FINISHED_KEPT:
            if self._texts.pop(self._finished.popitem(last=False)[0], None) is not None:
                self._view = None

    def view(self) -> Mapping[int, RequestText]:
        if self._view is None:
            self._view = MappingProxyType(dict(self._texts))
        return self._view
