"""Record the fields of Megatron-Bridge's config classes that ``bridge_overrides.yaml`` may
name: ``python -m tests.support.record_bridge_fields PATH`` with PATH an unpacked
``megatron_bridge-0.3.1`` wheel (``pip download megatron-bridge==0.3.1 --no-deps``, then
unzip). Writes ``tests/data/megatron_bridge_0_3_1_fields.json``.

Megatron-Bridge does not install without CUDA builds of its dependencies (transformer-engine,
mamba-ssm), so its classes are read from the source (the dataclass fields each class
declares, ``ast``) plus the megatron-core 0.16.1 classes they extend (imported: the test
environment holds megatron-core).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "megatron_bridge_0_3_1_fields.json"


def _own_fields(source: Path, cls: str) -> list[str]:
    tree = ast.parse(source.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return [s.target.id for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]


def _props(source: Path, cls: str) -> list[str]:
    tree = ast.parse(source.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return [f.name for f in node.body if isinstance(f, ast.FunctionDef)
            and any(getattr(d, "id", None) == "property" for d in f.decorator_list)]


def main(root: str) -> None:
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MCoreGPTDatasetConfig
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    bridge = Path(root) / "megatron" / "bridge"
    config = bridge / "training" / "config.py"
    names = lambda c: [f.name for f in dataclasses.fields(c)]   # noqa: E731
    record = {
        "source": "megatron-bridge 0.3.1 (megatron/bridge/training/config.py, "
                  "models/gpt_provider.py, training/mixed_precision.py) over megatron-core "
                  "0.16.1",
        "ConfigContainer": _own_fields(config, "ConfigContainer"),
        "model": sorted(set(names(TransformerConfig))
                        | set(_own_fields(bridge / "models" / "gpt_provider.py",
                                          "GPTModelProvider"))),
        "train": _own_fields(config, "TrainingConfig"),
        "ddp": names(DistributedDataParallelConfig),
        "optimizer": names(OptimizerConfig),
        "checkpoint": _own_fields(config, "CheckpointConfig"),
        "dataset": sorted(set(names(MCoreGPTDatasetConfig))
                          | set(_own_fields(config, "DataloaderConfig"))
                          | set(_props(config, "GPTDatasetConfig"))),
        "mixed_precision_recipes": sorted(
            n.name for n in ast.parse((bridge / "training" / "mixed_precision.py").read_text())
            .body if isinstance(n, ast.FunctionDef)
            and any(getattr(d, "id", None) == "register" for d in n.decorator_list)),
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
