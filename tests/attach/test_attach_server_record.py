"""A server family is one record: a throwaway one, added to the registry here and nowhere else, is
recognised from its /metrics text, its panels say what it cannot fill in its own words, and the
verdict's "try" names its own launch option."""

from __future__ import annotations

import pytest

from batchtop.core_engine.attach import servers
from batchtop.core_engine.attach.coverage import coverage
from batchtop.core_engine.attach.monitor import Monitor
from batchtop.core_engine.attach.report import cannot_fill
from batchtop.core_engine.attach.scrape.sample import BadExposition, parse_exposition
from batchtop.core_engine.attach.servers.family import Knobs, MetricNames, ServerFamily
from tests.support.attach_helpers import live

ACME = ServerFamily(
    name="acme", label="Acme", documented="this test", prefix="acme:",
    names=MetricNames(running="acme:running", waiting="acme:queued", prompt_tokens="acme:prompt_tokens_total",
                      generation_tokens="acme:output_tokens_total", ceiling="acme:max_running"),
    gaps={"kv": "Acme keeps its KV pool to itself", "waiting_reasons": "Acme gives no waiting reasons"},
    knobs=Knobs("--acme-max-running", "--acme-step-tokens", "--acme-kv-gib"))


def acme_text(tick: int) -> str:
    """Slot-bound: 4 running of 4 allowed, 20 queued, tokens flowing."""
    return ("# TYPE acme:running gauge\nacme:running 4\n# TYPE acme:queued gauge\nacme:queued 20\n"
            "# TYPE acme:max_running gauge\nacme:max_running 4\n"
            f"# TYPE acme:prompt_tokens counter\nacme:prompt_tokens_total {400 * tick}\n"
            f"# TYPE acme:output_tokens counter\nacme:output_tokens_total {40 * tick}\n")


@pytest.fixture
def acme_registered(monkeypatch):
    monkeypatch.setattr(servers, "SERVERS", servers.SERVERS + (ACME,))


def test_an_unregistered_server_is_named_as_none_attach_knows():
    with pytest.raises(BadExposition, match="no vLLM, SGLang, TGI, llama.cpp, LMDeploy, NIM or batchtop metrics"):
        parse_exposition(acme_text(1), 1.0)


def test_a_server_added_as_one_record_is_read_end_to_end(acme_registered):
    sample = parse_exposition(acme_text(1), 1.0)
    assert (sample.flavour, sample.running, sample.waiting, sample.max_num_seqs) == ("acme", 4, 20, 4)
    assert sample.ceiling_from == "acme:max_running" and sample.kv_usage is None

    assert coverage("acme")["kv"] == "Acme keeps its KV pool to itself" and coverage("acme")["ceiling"] is None

    monitor = Monitor(["http://acme:9000/metrics"])
    for tick in range(1, 13):
        frame = monitor.feed([live(parse_exposition(acme_text(tick), float(tick)))], float(tick))
    m = frame.main
    assert m.rates["prompt_tokens"] == pytest.approx(400.0)
    assert cannot_fill(m) == {"kv": "Acme keeps its KV pool to itself",
                              "waiting_reasons": "Acme gives no waiting reasons"}
    readings = frame.readings
    assert (readings.server, readings.ceiling, readings.ceiling_source) == ("Acme", 4, "from acme:max_running")
    assert readings.why_waiting == "the queue waits for a free slot (the verdict: slots)"

    verdict = frame.verdict
    assert verdict.kind == "slots"
    assert "ceiling of 4 (acme:max_running) in 100% of" in verdict.line
    assert "KV not exposed (Acme keeps its KV pool to itself)" in verdict.line
    assert verdict.advice.startswith("try: raise --acme-max-running above 4")


def test_a_record_that_names_a_gap_no_panel_knows_is_refused():
    with pytest.raises(ValueError, match=r"gaps \['kv_pool'\] are not among"):
        ServerFamily(name="typo", label="Typo", documented="-", names=None, gaps={"kv_pool": "..."})
