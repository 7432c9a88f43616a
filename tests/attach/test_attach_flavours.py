"""The servers beyond vLLM and SGLang, each read from fixtures written under its project's own names
(tests/data/README.md): TGI, llama.cpp with its /slots, LMDeploy, NIM and trtllm-serve's JSON
iteration stats. The flavour comes from the answer, never the URL; an exposition that mixes two
servers' names, or lacks the running and waiting gauges, is BAD with the reason."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from batchtop.core_engine.attach.servers.llamacpp import LLAMACPP
from batchtop.core_engine.attach.servers.lmdeploy import LMDEPLOY
from batchtop.core_engine.attach.servers.nim import NIM
from batchtop.core_engine.attach.servers.tgi import TGI
from batchtop.core_engine.attach.servers.trtllm import TRTLLM
from batchtop.core_engine.attach.scrape.llamacpp_slots import DISABLED_NOTE
from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.record.record import AttachRecorder, attach_header, monitor_for, recorded_ticks
from batchtop.core_engine.attach.scrape.sample import BadExposition, parse_exposition
from batchtop.core_engine.attach.scrape.scrape import BAD, LIVE, Scraper
from batchtop.core_engine.attach.scrape.trtllm_stats import IDLE_NOTE
from batchtop.core_engine.trace.trace import read_trace
from tests.support.attach_helpers import DATA, VLLM_IDLE, live, sglang_text
from tests.support.route_server import Routes, route_server


def text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def pair(a: str, b: str, dt: float = 2.0):
    monitor = Monitor(["server"])
    monitor.feed([live(parse_exposition(text(a), 0.0))], 0.0)
    return monitor.feed([live(parse_exposition(text(b), dt))], dt).replicas[0]


def test_tgi_gauges_and_rates_from_its_per_request_histograms():
    s = pair("tgi-3.3-a.prom", "tgi-3.3-b.prom")
    assert s.flavour == TGI and (s.running, s.waiting) == (12, 7) and s.kv_usage is None
    # 12 prompts validated in the 2 s (3960 tokens), 10 outputs finished (2880 tokens)
    assert s.rates["prompt_tokens"] == pytest.approx(3960 / 2) and s.rates["generation_tokens"] == pytest.approx(2880 / 2)
    assert s.finished == {"success": 10, "error": 0} and s.success_rate == 1.0
    assert s.latency["queue_time"]["count"] == 10 and "ttft" not in s.latency


def test_llamacpp_metrics_with_its_slots_give_the_ceiling_and_each_slot():
    routes = Routes({"/metrics": (200, text("llamacpp-a.prom")), "/slots": (200, text("llamacpp-slots.json"))})
    with route_server(routes) as url:
        scraper = Scraper(url, timeout_s=2.0)
        first = scraper.scrape()
        routes.routes["/metrics"] = (200, text("llamacpp-b.prom"))
        second = scraper.scrape()
        routes.routes["/slots"] = (501, '{"error": {"code": 501, "message": "This server does not support slots endpoint."}}')
        off = scraper.scrape()
        scraper.close()
    s = second.sample
    assert first.status == second.status == LIVE and s.flavour == LLAMACPP
    assert (s.running, s.waiting, s.max_num_seqs, s.ceiling_from) == (4, 5, 4, "/slots")
    assert [slot.processing for slot in s.slots] == [True] * 4 and s.slots[3].n_decoded == 160
    assert off.status == LIVE and off.sample.slots is None and off.sample.note == DISABLED_NOTE
    assert off.sample.max_num_seqs is None
    monitor = Monitor([url])
    monitor.feed([live(dataclasses.replace(first.sample, t=0.0))], 0.0)
    m = monitor.feed([live(dataclasses.replace(s, t=2.0))], 2.0).replicas[0]
    assert m.rates["steps"] == pytest.approx(90 / 2)
    assert m.tokens_per_step == pytest.approx((512 + 330) / 90)  # llama.cpp counts steps, not their tokens


def test_llamacpp_at_its_slot_count_with_requests_deferred_is_slot_bound():
    routes = Routes({"/metrics": (200, text("llamacpp-b.prom")), "/slots": (200, text("llamacpp-slots.json"))})
    monitor = Monitor(["llama"])
    with route_server(routes) as url:
        scraper = Scraper(url, timeout_s=2.0)
        for i in range(8):
            sample = dataclasses.replace(scraper.scrape().sample, t=float(i), counters={"prompt_tokens": 100.0 * i})
            frame = monitor.feed([live(sample)], float(i))
        scraper.close()
    v = frame.verdict
    assert v.kind == "slots" and v.evidence["ceiling"] == 4 and v.evidence["ceiling_source"] == "/slots"
    assert "try: raise --parallel above 4" in v.advice


def test_lmdeploy():
    s = pair("lmdeploy-a.prom", "lmdeploy-b.prom")
    assert s.flavour == LMDEPLOY and (s.running, s.waiting) == (16, 11) and s.kv_usage == pytest.approx(0.64)
    assert s.rates["generation_tokens"] == pytest.approx(100 * 16 / 2) and s.rates["steps"] == pytest.approx(50)
    assert s.tokens_per_step == pytest.approx(16) and s.latency["ttft"]["count"] == 6
    assert s.model_name == "internlm2_5-7b-chat"


def test_nim_says_its_ceiling_and_a_quiet_nim_is_client_bound():
    s = pair("nim-a.prom", "nim-b.prom")
    assert s.flavour == NIM and (s.max_num_seqs, s.ceiling_from, s.max_num_seqs_source) == (256, "num_request_max", "server")
    assert s.kv_usage == pytest.approx(0.34) and s.finished == {"success": 6, "error": 0}
    monitor = Monitor(["nim"])
    for i in range(8):
        frame = monitor.feed([live(parse_exposition(text("nim-b.prom"), float(i)))], float(i))
    assert frame.verdict.kind == "client" and "of 256 slots" in frame.verdict.line


def trtllm_routes() -> Routes:
    a, b = text("trtllm-a.json"), json.loads(text("trtllm-b.json"))
    routes = Routes({"/metrics": (200, a)})
    routes.queues["/metrics"] = [(200, a)] + [(200, json.dumps(b))] * 7
    return routes


def test_trtllm_iteration_stats_are_summed_across_scrapes():
    with route_server(trtllm_routes()) as url:
        scraper = Scraper(url, timeout_s=2.0)
        results = [scraper.scrape() for _ in range(3)]
        scraper.close()
    assert {r.status for r in results} == {LIVE}
    s = results[-1].sample
    assert s.flavour == TRTLLM and (s.running, s.waiting) == (10, 24) and s.waiting_by_reason == {"queued": 24, "paused": 0}
    assert s.kv_usage == pytest.approx(3072 / 4096) and (s.num_gpu_blocks, s.block_size) == (4096, 32)
    assert (s.max_num_seqs, s.ceiling_from, s.token_budget) == (64, "maxNumActiveRequests", 8192)
    assert s.counters["steps"] == 120 and s.success == {"completed": 15}  # 40 iterations a scrape, 1 in 8 completes one
    assert s.histograms["iteration_tokens"].count == 120 and s.counters["generation_tokens"] == 120 * 9


def test_trtllm_at_its_token_budget_is_budget_bound():
    monitor = Monitor(["trtllm"])
    with route_server(trtllm_routes()) as url:
        scraper = Scraper(url, timeout_s=2.0)
        for i in range(8):
            frame = monitor.feed([live(dataclasses.replace(scraper.scrape().sample, t=float(i)))], float(i))
        scraper.close()
    v = frame.verdict
    assert v.kind == "budget" and "(the budget of 8192)" in v.line and "--max_num_tokens above 8192" in v.advice


def test_trtllm_with_no_new_iteration_is_idle_and_says_why_and_bad_stats_are_refused():
    routes = Routes({"/metrics": (200, "[]")})
    answers = {}
    with route_server(routes) as url:
        scraper = Scraper(url, timeout_s=2.0)
        idle = scraper.scrape()
        for name, body in (("negative", [{"iter": 1, "numActiveRequests": -3}]), ("other", {"status": "ok"}),
                           ("overfull", [{"numActiveRequests": 1, "kvCacheStats": {"maxNumBlocks": 8, "usedNumBlocks": 9}}]),
                           ("text", "[not json")):
            routes.routes["/metrics"] = (200, body if isinstance(body, str) else json.dumps(body))
            answers[name] = scraper.scrape()
        scraper.close()
    assert idle.status == LIVE and (idle.sample.running, idle.sample.waiting) == (0, 0) and idle.sample.note == IDLE_NOTE
    assert {r.status for r in answers.values()} == {BAD}
    assert answers["negative"].reason == "iteration stats [0].numActiveRequests = -3: not a count"
    assert "not TensorRT-LLM's iteration stats" in answers["other"].reason
    assert answers["overfull"].reason == "iteration stats [0].kvCacheStats: 9 blocks used of 8"
    assert answers["text"].reason == "JSON that does not parse (not TensorRT-LLM's iteration stats)"


def test_a_slots_answer_that_is_not_slots_costs_the_slots_panel_not_the_scrape():
    routes = Routes({"/metrics": (200, text("llamacpp-a.prom")), "/slots": (200, "<html>busy</html>")})
    with route_server(routes) as url:
        scraper = Scraper(url, timeout_s=2.0)
        result = scraper.scrape()
        routes.routes["/slots"] = (200, json.dumps([{"id": 0}]))
        partial = scraper.scrape()
        scraper.close()
    assert result.status == LIVE and result.sample.note == "/slots answered something that is not JSON"
    assert partial.status == LIVE and partial.sample.note == "/slots entry 0 has no id or is_processing"
    assert result.sample.max_num_seqs is None and result.sample.running == 4


@pytest.mark.parametrize("exposition,reason", [
    (VLLM_IDLE.read_text() + sglang_text(1, 0, 0.1, 10, 20, [0.1]), "mixes vLLM and SGLang metrics"),
    (text("tgi-3.3-a.prom") + "\n" + text("nim-a.prom"), "mixes TGI and NIM metrics"),
    (text("llamacpp-a.prom") + text("lmdeploy-a.prom"), "mixes llama.cpp and LMDeploy metrics"),
    (re.sub(r"^vllm:num_requests_running\{.*\n", "", VLLM_IDLE.read_text(), flags=re.M),
     "vLLM metrics without vllm:num_requests_running: vLLM always exposes its running and waiting gauges"),
    (re.sub(r"^tgi_queue_size .*\n", "", text("tgi-3.3-a.prom"), flags=re.M), "TGI metrics without tgi_queue_size"),
    (re.sub(r"^llamacpp:requests_processing .*\n", "", text("llamacpp-a.prom"), flags=re.M),
     "llama.cpp metrics without llamacpp:requests_processing"),
    (re.sub(r"^lmdeploy:num_requests_waiting\{.*\n", "", text("lmdeploy-a.prom"), flags=re.M),
     "LMDeploy metrics without lmdeploy:num_requests_waiting"),
    (re.sub(r"^num_requests_running\{.*\n", "", text("nim-a.prom"), flags=re.M),
     "NIM metrics without num_requests_running"),
    (re.sub(r"^sglang:num_queue_reqs\{.*\n", "", sglang_text(1, 0, 0.1, 10, 20, [0.1]), flags=re.M),
     "SGLang metrics without sglang:num_queue_reqs"),
    (text("nim-a.prom").replace("num_request_max", "num_request_most") + "num_request_max 1e300\n",
     "num_request_max = 1e+300: no server runs that many"),
    (sglang_text(1, 0, 0.1, 10, 20, [0.1]) + "batchtop:max_num_seqs 8\n",
     "batchtop's own metrics (batchtop:max_num_seqs) beside SGLang's"),
])
def test_an_exposition_of_two_servers_or_without_the_core_gauges_is_bad(exposition, reason):
    with pytest.raises(BadExposition) as info:
        parse_exposition(exposition, 0.0)
    assert reason in str(info.value)


def test_the_new_fields_of_a_sample_record_and_replay(tmp_path):
    routes = Routes({"/metrics": (200, text("llamacpp-a.prom")), "/slots": (200, text("llamacpp-slots.json"))})
    with route_server(routes) as url:
        scraper = Scraper(url, timeout_s=2.0)
        result = scraper.scrape()
        scraper.close()
    path = str(tmp_path / "llama.jsonl")
    rec = AttachRecorder(path, attach_header([url], 1.0, 30.0, None, None, None))
    rec.tick(1, 0.0, [result])
    rec.close(0.0)
    (_, [replayed]), = list(recorded_ticks(read_trace(path)))
    assert replayed.sample == result.sample and monitor_for(read_trace(path)).urls == [url]


def test_the_json_says_what_each_server_cannot_fill(tmp_path):
    """TGI: no KV usage, no ceiling; llama.cpp with /slots on: its ceiling is filled, no KV usage."""
    from click.testing import CliRunner

    from batchtop.tui.cli import main
    docs = {}
    for name, routes in (("tgi", Routes({"/metrics": (200, text("tgi-3.3-a.prom"))})),
                         ("llamacpp", Routes({"/metrics": (200, text("llamacpp-a.prom")),
                                              "/slots": (200, text("llamacpp-slots.json"))}))):
        out = tmp_path / f"{name}.json"
        with route_server(routes) as url:
            result = CliRunner().invoke(main, ["attach", url, "--headless", "--duration", "0.6", "--interval", "0.2",
                                               "-o", str(out)])
        assert result.exit_code == 0, result.output
        docs[name] = json.loads(out.read_text())
    tgi = docs["tgi"]["replicas"][0]["cannot_fill"]
    assert tgi["kv"].startswith("TGI exposes no KV usage") and tgi["ceiling"] == "TGI does not export max_batch_size"
    assert "lengths" not in tgi  # TGI has its per-request length histograms
    llama = docs["llamacpp"]["replicas"][0]
    assert llama["ceiling_from"] == "/slots" and "ceiling" not in llama["cannot_fill"]
    assert set(llama["cannot_fill"]) >= {"kv", "ttft", "finished", "lengths"}


def test_the_flavour_comes_from_the_answer_never_the_url():
    """NIM at its /v1/metrics, and vLLM's names at a path that says sglang: each read as what it answered."""
    routes = Routes({"/v1/metrics": (200, text("nim-a.prom")), "/sglang/metrics": (200, VLLM_IDLE.read_text()),
                     "/vllm/metrics": (200, text("tgi-3.3-a.prom"))})
    with route_server(routes) as url:
        flavours = {}
        for path in ("/v1/metrics", "/sglang", "/vllm/metrics"):
            scraper = Scraper(url + path, timeout_s=2.0)
            flavours[path] = scraper.scrape().sample.flavour
            scraper.close()
    assert flavours == {"/v1/metrics": NIM, "/sglang": "vllm", "/vllm/metrics": TGI}
