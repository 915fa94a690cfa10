"""Strict JSON out: no NaN or Infinity in anything the tool prints or writes."""

import json
import math

import numpy as np

from configurator.core import jsonout
from tests.conftest import run_cli


def _strict(text):
    def bad(name):
        raise AssertionError(f"{name} in JSON output")
    return json.loads(text, parse_constant=bad)


def test_non_finite_numbers_become_null_and_numpy_becomes_plain():
    doc = {"a": math.inf, "b": [np.float64("nan"), np.int64(3), (1.5, -math.inf)],
           "c": np.array([1.0, np.inf])}
    assert _strict(jsonout.dumps(doc)) == {"a": None, "b": [None, 3, [1.5, None]],
                                           "c": [1.0, None]}


def test_search_and_estimate_json_is_strict():
    for argv in (["search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "1",
                  "--gbs", "16", "--json", "--top", "3"],
                 ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                  "1", "--gbs", "16", "--tp", "8", "--pp", "1", "--mbs", "1", "--json"]):
        res = run_cli(*argv)
        assert res.returncode == 0, res.stderr
        _strict(res.stdout)
