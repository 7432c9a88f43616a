"""The one JSON writer every command's result goes through: a NaN or an Infinity that reaches it
becomes null, so the final write of a run can never fail on one (and lose the run) and the file stays
strict JSON any parser reads."""

from __future__ import annotations

import json
import math

from batchtop.core_engine.output_files import deliver_json, json_text

NAN, INF = float("nan"), float("inf")


def strict(text: str) -> object:
    def refuse(name: str) -> float:
        raise ValueError(f"{name} in a JSON document")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_anywhere_in_a_document_are_written_as_null():
    doc = {"window_s": INF, "rates": {"gen": NAN, "ok": 1.5}, "points": [1.0, -INF, (2, NAN)], "n": 3,
           "flag": True, "name": "nan", "none": None}
    assert strict(json_text(doc)) == {"window_s": None, "rates": {"gen": None, "ok": 1.5},
                                      "points": [1.0, None, [2, None]], "n": 3, "flag": True, "name": "nan",
                                      "none": None}
    assert math.isnan(doc["rates"]["gen"])  # the caller's document is left as it was


def test_a_run_whose_result_holds_an_infinity_is_still_delivered(tmp_path):
    out = tmp_path / "result.json"
    assert deliver_json({"duration_s": INF, "ticks": 4}, str(out)) is True
    assert strict(out.read_text()) == {"duration_s": None, "ticks": 4}
