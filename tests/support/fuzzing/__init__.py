"""Fuzzing the ``configurator`` CLI end to end: Hypothesis strategies that build one CLI call
(argv plus the input files it names) per input format, and a runner that feeds each call to
the real CLI (:func:`configurator.cli.main`) and classifies what happened.

Targets (:data:`TARGETS`), one per input format:

``model``      model YAML/JSON with Megatron keys (``--model FILE`` of search/estimate)
``cluster``    cluster YAML/JSON, GPU preset or full GPU mapping (``--cluster FILE``)
``hf_config``  Hugging Face ``config.json`` (Llama/Mistral/Qwen or GPT-2 keys; the folder name
               becomes the model name)
``topofile``   measured topology file (``audit --topology``, ``topology import``,
               ``search/estimate --topology``)
``nccl``       nccl-tests logs (``topology import``, ``audit LOGS``)
``nvsmi``      ``nvidia-smi topo -m`` output (``topology import``, ``audit``)
``plan``       ``plan.json`` of ``search --out``, mutated (``launch --plan``)
``argv``       random flags and values for search, estimate, launch, topology import, audit,
               probe
``runs``       measured-run file, YAML or JSON, mutated (``validate RUNS``, ``calibrate RUNS``)
``calibration`` calibration file of ``calibrate -o``, mutated (``--calibration`` of estimate,
               search, validate)

Each input mixes valid-looking documents with hostile ones: integers >= 2**63, 1e308,
NaN/inf, negatives, strings where numbers go, non-string YAML keys, YAML alias bombs, deep
nesting, non-ASCII digits in host names, ``$...$`` in names, control characters and Unicode
line separators, truncated/garbage/binary/empty files, very long lines.

The runner (:class:`Runner`) keeps one long-lived worker subprocess per target (fed over a
pipe, restarted after a hang, a crash, a MemoryError or every :data:`RECYCLE_AFTER` inputs).
The worker writes the input files into a fresh temporary directory, makes it the working
directory (argv uses relative paths), calls ``main(argv)`` with stdout/stderr captured and
reports back. :func:`classify` turns that into failures:

``traceback``  an exception escaping ``main``, a SystemExit/return code other than 0, 2, 3,
               or the worker process dying;
``hang``       no answer within :data:`TIMEOUT_S` seconds;
``memory``     peak RSS above :data:`MEMORY_LIMIT` (the worker also runs under RLIMIT_AS) or
               a MemoryError;
``multiline``  exit 2 or 3 whose stderr is not exactly one non-empty line (``str.splitlines``:
               Unicode line separators count);
``json``       ``--json`` output, or a ``.json`` file the call wrote, that is not strict JSON
               (NaN/Infinity, or not JSON at all).

:func:`shrink` reduces a failing :class:`Case` to a smaller one with the same failure
signature; :func:`save_case` writes a reproducer directory. Used by
``tests/test_fuzz_inputs.py`` (quick profile) and ``python -m bench.robustness.fuzz`` (report).

The parts: :mod:`.case` (the call), :mod:`.documents` (hostile values and documents),
:mod:`.strategies` (one strategy per target), :mod:`.corpus` (the fixed hostile inputs),
:mod:`.worker` (the subprocess and its pipe protocol), :mod:`.runner` (the parent side and the
classification), :mod:`.shrink` (shrinking and reproducers).
"""

from tests.support.fuzzing.case import Case
from tests.support.fuzzing.corpus import regression_cases
from tests.support.fuzzing.runner import (CATEGORIES, TIMEOUT_S, Failure, Outcome, Runner,
                                          classify, run_target)
from tests.support.fuzzing.shrink import describe_files, save_case, shrink, slug
from tests.support.fuzzing.strategies import TARGETS, case_strategy
from tests.support.fuzzing.worker import MEMORY_LIMIT

__all__ = ["CATEGORIES", "MEMORY_LIMIT", "TARGETS", "TIMEOUT_S", "Case", "Failure", "Outcome",
           "Runner", "case_strategy", "classify", "describe_files", "regression_cases",
           "run_target", "save_case", "shrink", "slug"]
