"""`batchtop attach --headless --vllm-log FILE --kv-events tcp://...` end to end over local stand-ins
made of the real vLLM capture: every line appended to the log while the watch ran is a step in the JSON,
and the prefix cache counts exactly the blocks the published messages stored and did not remove; bad
stream options exit 2 naming the option."""

from __future__ import annotations

import json
import os
import struct
import threading

import msgpack
import pytest
import zmq

from click.testing import CliRunner

from batchtop.tui.cli.attach import AttachOptions, prepare, run_headless
from batchtop.tui.cli.main import main
from tests.support.exits import assert_exit_2
from tests.attach.streams.kv_helpers import TOPIC
from tests.support.local_http import local_server
from tests.support.step_stream_server import metrics_handler, step_stream_server
from tests.support.vllm_step_streams import cached_after, scrapes_unix


def test_headless_attach_follows_the_log_and_the_kv_events(tmp_path):
    out = tmp_path / "attach.json"
    with step_stream_server(tmp_path, seconds=1.5) as server:
        opts = AttachOptions(interval=0.25, headless=True, duration=3.0, output=str(out), max_num_seqs=8,
                             device="h100", vllm_log=str(server.log_path), kv_events=server.kv_endpoint,
                             kv_replay=server.replay_endpoint, record=str(tmp_path / "rec.jsonl"))
        setup = prepare((server.url,), opts)
        server.start()
        assert run_headless(setup) == 0
        assert server.done.is_set()
    doc = json.loads(out.read_text())
    steps, cache = doc["streams"]["step_log"], doc["streams"]["prefix_cache"]
    assert steps["steps"] == len(server.lines_written) > 100 and steps["unparsed_lines"] == 0
    assert steps["other_lines"] == 0 and steps["dropped_lines"] == 0
    assert cache["cached_blocks"] == cached_after(server.messages_sent) and cache["malformed_messages"] == 0
    assert doc["streams"]["kv_link"].startswith(f"kv events: {len(server.messages_sent)} batches")
    recorded = [json.loads(line) for line in (tmp_path / "rec.jsonl").read_text().splitlines()]
    assert sum(e["type"] == "log_line" for e in recorded) == len(server.lines_written)
    assert all(a["t"] <= b["t"] for a, b in zip(recorded, recorded[1:]))  # lines read mid-scrape sorted in


@pytest.mark.parametrize("args, option", [
    (["--vllm-log", "/nonexistent/vllm.log"], "--vllm-log"),
    (["--vllm-log", "/"], "--vllm-log"),
    (["--kv-events", "localhost:5557"], "--kv-events"),
    (["--kv-events", "tcp://*:5557"], "--kv-events"),
    (["--kv-replay", "tcp://127.0.0.1:5558"], "--kv-replay"),
])
def test_bad_stream_options_exit_2_naming_the_option(args, option):
    result = CliRunner().invoke(main, ["attach", "http://127.0.0.1:9/", "--headless", "--duration", "1", *args])
    assert_exit_2(result, option)


def test_hostile_streams_are_counted_and_the_watch_ends_normally(tmp_path):
    """Random bytes, a garbage payload, ten million events in one message, a sequence that jumps back,
    and 1 MB log lines: counted, skipped, and the watch still writes its JSON and exits 0."""
    n = 10_000_000
    flood = b"\x93" + msgpack.packb(1.0) + b"\xdd" + n.to_bytes(4, "big") + b"\x91\xa1X" * n + b"\x00"
    messages = [[os.urandom(64)], [TOPIC, struct.pack(">q", 0), os.urandom(200)],
                [TOPIC, struct.pack(">q", 1), flood], [TOPIC, struct.pack(">q", 0), msgpack.packb([2.0, [], 0])]]
    log = tmp_path / "vllm.log"
    log.write_text("")
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    out = tmp_path / "attach.json"

    def send() -> None:
        threading.Event().wait(1.0)
        for message in messages:
            pub.send_multipart(message)
        with open(log, "ab") as f:
            f.write(b"Engine 000: Iteration(1): " + b"7" * (1 << 20) + b"\n" + b"y" * (1 << 20) + b"\n")

    try:
        with local_server(metrics_handler([body for _, body in scrapes_unix()[10:20]])) as url:
            setup = prepare((url,), AttachOptions(interval=0.25, headless=True, duration=3.0, output=str(out),
                                                  device="h100", vllm_log=str(log), kv_events=f"tcp://127.0.0.1:{port}"))
            sender = threading.Thread(target=send)
            sender.start()
            assert run_headless(setup) == 0
            sender.join()
    finally:
        pub.close()
        context.term()
    doc = json.loads(out.read_text())
    cache, steps = doc["streams"]["prefix_cache"], doc["streams"]["step_log"]
    assert cache["malformed_messages"] >= 1 and cache["left_out_events"] == n - 100_000
    assert "server restarted 1x" in doc["streams"]["kv_link"]
    assert steps["long_lines"] == 2 and steps["steps"] == 0
