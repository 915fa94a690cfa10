"""bench/README.md lists every bench (``python -m bench.<group>.<name>``) in its table."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_readme_lists_every_bench():
    text = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    rows = {tuple(c.strip().strip("`") for c in line.split("|")[1:3])
            for line in text.splitlines() if line.startswith("| ")}
    benches = {(p.parent.name, p.stem) for p in (ROOT / "bench").glob("*/*.py")
               if p.stem != "__init__"}
    assert benches and benches <= rows, sorted(benches - rows)
