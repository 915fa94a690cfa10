"""bench/README.md's table lists every bench (``bench/<group>/<name>.py``) in its group."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_bench_readme_lists_every_bench():
    text = (BENCH / "README.md").read_text()
    listed = set(re.findall(r"^\| (\w+) \| `(\w+)` \|", text, flags=re.M))
    benches = {(p.parent.name, p.stem) for p in BENCH.glob("*/*.py") if p.stem != "__init__"}
    assert benches - listed == set(), "benches missing from bench/README.md"
    assert listed - benches == set(), "bench/README.md lists benches that do not exist"
    for _, name in benches:
        assert f"### `{name}`" in text, f"no section for {name}"
