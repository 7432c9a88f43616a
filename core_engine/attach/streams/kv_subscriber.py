"""A live subscription to a server's KV-event publisher, on its own daemon thread, drained once a tick.

The thread keeps the messages raw (the recorder stores the frames; the consumer decodes them) and reads
only each one's 8-byte sequence number, to spot what the PUB socket lost. A forward jump is a gap: the
thread asks the replay endpoint for it the way vLLM's ROUTER expects (a DEALER sends an empty delimiter
and the first missing seq as 8 big-endian bytes; the ROUTER streams back `topic, seq, payload` for every
batch it still holds from there, then an end marker whose seq is -1) and delivers what came back in
order before the message that showed the gap. A gap it cannot fill is counted and put in words. A jump
back is a restarted server: counted, and counted from there.

Nothing here can hang the watch: every wait is a poll with a timeout, sockets close with LINGER 0,
close() returns within about a second whatever the publisher does, a replay endpoint that stays silent
is not asked again for a while, and messages, frames and the buffer are all bounded (the oldest
message is dropped, and counted, when the consumer falls behind).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import zmq

from batchtop.core_engine.attach.streams.kv_endpoints import default_replay_endpoint, parse_endpoint
from batchtop.core_engine.attach.streams.kv_event_frames import MAX_MESSAGE_BYTES, SEQ_BYTES

__all__ = ["KVEventSubscriber", "KVLinkStats", "ReceivedKV", "default_replay_endpoint", "parse_endpoint"]

POLL_MS = 50  # the thread looks at its stop flag at least this often
REPLAY_TIMEOUT_S = 1.0  # vLLM services its ROUTER between batches, every 0.1 s when idle
REPLAY_COOLDOWN_S = 10.0  # after a silent replay endpoint, gaps are not asked about for this long
CLOSE_WAIT_S = 1.0
RCV_HWM = 1000  # messages ZMQ queues for us while the thread is replaying
MAX_BUFFERED = 10_000  # messages waiting for drain()
MAX_BUFFERED_BYTES = 256 << 20
_KEPT_FRAMES = 4  # one more than a batch has, so the decoder can say a message had too many
END_SEQ = (1 << 64) - 1  # vLLM's end-of-replay marker: -1 as 8 signed big-endian bytes


@dataclass(frozen=True, slots=True)
class ReceivedKV:
    t_unix: float  # when this process received it
    frames: tuple[bytes, ...]  # as sent: topic, 8-byte seq, msgpack payload (a bad message: whatever came)
    replayed: bool = False  # fetched from the replay endpoint to fill a gap


@dataclass(frozen=True, slots=True)
class KVLinkStats:
    received: int  # live messages
    replayed: int  # messages the replay endpoint sent to fill gaps
    gaps: int
    gaps_filled: int
    gaps_unfilled: int
    missed: int  # sequence numbers never delivered
    restarts: int  # the sequence jumped back
    dropped: int  # oldest messages dropped because drain() fell behind
    unsequenced: int  # messages without a readable seq frame, delivered raw for the decoder to reject
    last_seq: int | None
    last_gap: str | None  # e.g. "seq 120-131 missed, replay endpoint silent"
    error: str | None  # the socket error that ended the thread


def _seq_of(frames: list[bytes]) -> int | None:
    if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
        return None
    return int.from_bytes(frames[1], "big")


def _recv(sock: zmq.Socket, keep: int = _KEPT_FRAMES) -> list[bytes]:
    """One whole message, keeping its first `keep` frames: a message of endless frames costs no memory."""
    frames = [sock.recv(zmq.NOBLOCK)]
    while sock.getsockopt(zmq.RCVMORE):
        part = sock.recv(zmq.NOBLOCK)
        if len(frames) < keep:
            frames.append(part)
    return frames


def _span(start: int, stop: int) -> str:
    return f"seq {start}" if stop - start == 1 else f"seq {start}-{stop - 1}"


class KVEventSubscriber:
    """SUB socket to a KV-event publisher; start() begins receiving, drain() hands over what came."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "kv-events", *,
                 catch_up: bool = False, replay_timeout_s: float = REPLAY_TIMEOUT_S,
                 max_buffered: int = MAX_BUFFERED) -> None:
        self.endpoint = parse_endpoint(endpoint)
        self.replay_endpoint = parse_endpoint(replay_endpoint) if replay_endpoint else None
        self.topic = topic
        self.catch_up = catch_up  # replay the publisher's history from seq 0 when we join mid-stream
        self.replay_timeout_s = replay_timeout_s
        self.max_buffered = max_buffered
        self._ctx = zmq.Context()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._buffer: deque[ReceivedKV] = deque()
        self._buffered_bytes = 0
        self._thread: threading.Thread | None = None
        self._expected: int | None = None  # the next seq; None until the first message
        self._silent_until = 0.0
        self._counts = dict.fromkeys(("received", "replayed", "gaps", "gaps_filled", "gaps_unfilled",
                                      "missed", "restarts", "dropped", "unsequenced"), 0)
        self._last_gap: str | None = None
        self._error: str | None = None

    def start(self) -> KVEventSubscriber:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="batchtop-kv-events", daemon=True)
            self._thread.start()
        return self

    def drain(self) -> list[ReceivedKV]:
        with self._lock:
            out = list(self._buffer)
            self._buffer.clear()
            self._buffered_bytes = 0
        return out

    def stats(self) -> KVLinkStats:
        with self._lock:
            c = dict(self._counts)
            last = self._expected - 1 if self._expected is not None else None
            return KVLinkStats(**c, last_seq=last, last_gap=self._last_gap, error=self._error)

    def status_line(self) -> str:
        """The link in a few words for a panel: batches, gaps, what was lost and why."""
        s = self.stats()
        if s.error is not None:
            return f"kv events: stopped: {s.error}"
        if s.received == 0:
            return f"kv events: no batch yet from {self.endpoint}"
        parts = [f"{s.received + s.replayed} batches"]
        if s.gaps_filled:
            parts.append(f"{s.gaps_filled} gap{'s' * (s.gaps_filled != 1)} replayed")
        if s.gaps_unfilled:
            parts.append(f"{s.missed} missed ({s.last_gap})" if s.last_gap else f"{s.missed} missed")
        if s.restarts:
            parts.append(f"server restarted {s.restarts}x")
        if s.dropped:
            parts.append(f"{s.dropped} dropped (console behind)")
        if s.unsequenced:
            parts.append(f"{s.unsequenced} without a sequence number")
        return "kv events: " + ", ".join(parts)

    def close(self) -> None:
        """Stop the thread; returns within about CLOSE_WAIT_S whatever the publisher is doing."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is None:
            self._ctx.term()
        else:
            self._thread.join(CLOSE_WAIT_S)

    def __enter__(self) -> KVEventSubscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the thread -------------------------------------------------------------------------------

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # a bigger frame disconnects the peer
        sock.setsockopt(zmq.RCVHWM, RCV_HWM)
        return sock

    def _run(self) -> None:
        sub: zmq.Socket | None = None
        try:
            sub = self._socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
            sub.connect(self.endpoint)
            while not self._stop.is_set():
                if sub.poll(POLL_MS):
                    self._take(_recv(sub), time.time())
        except zmq.ZMQError as exc:
            with self._lock:
                self._error = f"{self.endpoint}: {exc}"
        finally:
            if sub is not None:
                sub.close(linger=0)
            self._ctx.term()

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for key, n in deltas.items():
                self._counts[key] += n

    def _push(self, message: ReceivedKV) -> None:
        size = sum(len(f) for f in message.frames)
        with self._lock:
            self._buffer.append(message)
            self._buffered_bytes += size
            while len(self._buffer) > self.max_buffered or self._buffered_bytes > MAX_BUFFERED_BYTES:
                old = self._buffer.popleft()
                self._buffered_bytes -= sum(len(f) for f in old.frames)
                self._counts["dropped"] += 1

    def _take(self, frames: list[bytes], t_unix: float) -> None:
        self._count(received=1)
        seq = _seq_of(frames)
        if seq is None:
            self._count(unsequenced=1)
        else:
            expected = self._expected
            if expected is None:
                if self.catch_up and seq > 0:
                    self._fill(0, seq, t_unix, "sent before we joined")
            elif seq > expected:
                self._fill(expected, seq, t_unix)
            elif seq < expected:  # a new publisher counts from 0: what it sent before this was missed
                self._count(restarts=1)
                if seq > 0:
                    self._fill(0, seq, t_unix)
            with self._lock:
                self._expected = seq + 1
        self._push(ReceivedKV(t_unix, tuple(frames), False))

    def _fill(self, start: int, stop: int, t_unix: float, lost: str = "missed") -> None:
        """Ask the replay endpoint for seqs [start, stop), deliver what came, describe what did not."""
        got, why = self._replay(start, stop)
        for seq in sorted(got):  # stamped like the message that showed the gap: times stay in order
            self._push(ReceivedKV(t_unix, got[seq], True))
        wanted, span = stop - start, _span(start, stop)
        missing = wanted - len(got)
        if missing == 0:
            text = f"{span} {lost}, replayed"
        elif got:
            text = f"{span} {lost}: {missing} of {wanted} not replayed, {why}"
        else:
            text = f"{span} {lost}, {why}"
        with self._lock:
            c = self._counts
            c["gaps"] += 1
            c["replayed"] += len(got)
            c["missed"] += missing
            c["gaps_filled" if missing == 0 else "gaps_unfilled"] += 1
            self._last_gap = text

    def _replay(self, start: int, stop: int) -> tuple[dict[int, tuple[bytes, ...]], str]:
        """The replayed messages by seq (only those in [start, stop)), and why any are missing."""
        if self.replay_endpoint is None:
            return {}, "no replay endpoint"
        if time.monotonic() < self._silent_until:
            return {}, "replay endpoint silent"
        got: dict[int, tuple[bytes, ...]] = {}
        answered = ended = False
        room = MAX_BUFFERED_BYTES
        dealer = self._socket(zmq.DEALER)
        try:
            dealer.connect(self.replay_endpoint)
            dealer.send_multipart([b"", start.to_bytes(SEQ_BYTES, "big")], zmq.NOBLOCK)
            deadline = time.monotonic() + self.replay_timeout_s
            while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
                if not dealer.poll(min(POLL_MS, max(1, int(left * 1000)))):
                    continue
                parts = _recv(dealer, keep=_KEPT_FRAMES + 1)
                answered = True
                if parts and parts[0] == b"":
                    parts = parts[1:]  # the DEALER's empty delimiter
                seq = _seq_of(parts)
                if seq is None:
                    continue
                if seq == END_SEQ:
                    ended = True
                    break
                size = sum(len(p) for p in parts)
                if start <= seq < stop and len(got) < self.max_buffered and size <= room:
                    got[seq] = tuple(parts)
                    room -= size
                if seq >= stop - 1:  # the ROUTER sends in order: nothing it sends later is wanted
                    ended = True
                    break
        except zmq.ZMQError:
            pass  # EAGAIN on send included: treated as a silent endpoint
        finally:
            dealer.close(linger=0)
        if not answered:
            self._silent_until = time.monotonic() + REPLAY_COOLDOWN_S
            return got, "replay endpoint silent"
        return got, "not in the replay buffer" if ended else "replay timed out"
