"""``configurator profile``: one layer timed with torch on the CPU (never a GPU here), the
profile file, its strict loader and the analytic comparison's arithmetic."""

import copy
import json
import subprocess
import sys

import pytest

from configurator.app.profile_jobs import (Profile, ProfileRequest, analytic_comparison,
                                           moe_note, run_profile)
from configurator.cli.commands import Parser
from topology.gpus import guess_gpu_preset
from configurator.cli.profile_command import (add_profile_arguments, format_profile,
                                              run_profile as run_profile_command)
from configurator.core.errors import InputError
from configurator.core.model import make_model
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.profile import FORMAT, load_profile, profile_from_dict
from configurator.profiler import layer as profiler_layer
from configurator.profiler.layer import fp8_backend, layer_shapes

torch = pytest.importorskip("torch")

#: Small enough for a few milliseconds per layer on the CPU, large enough that the
#: backward's two GEMMs per forward GEMM show.
TINY = dict(name="tiny", num_layers=2, hidden_size=128, num_attention_heads=4,
            num_query_groups=2, vocab_size=128, seq_length=128, swiglu=True,
            normalization="RMSNorm", position_embedding_type="rope", hidden_dropout=0.0,
            attention_dropout=0.0, add_bias_linear=False, ffn_hidden_size=512)


@pytest.fixture
def tiny_yaml(tmp_path):
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return str(path)


def _request(model, out, **kw):
    base = dict(model=model, tp=(1, 2), mbs=(2,), device="cpu", warmup=2, repeats=5,
                out=str(out))
    return ProfileRequest(**(base | kw))


def test_profile_tiny_model_on_cpu_round_trips(tiny_yaml, tmp_path, monkeypatch):
    used = []
    build = profiler_layer.build_layer

    def spy(torch_, te, model, shape, device):
        used.append(shape)
        return build(torch_, te, model, shape, device)

    monkeypatch.setattr(profiler_layer, "build_layer", spy)
    out = tmp_path / "profile.yaml"
    res = run_profile(_request(tiny_yaml, out))
    assert isinstance(res, Profile) and res.written == str(out)
    # the per-rank shapes: tp 2 halves heads, QKV, fc1 and (sequence parallel) the tokens
    one, two = used
    assert (one.tp, one.heads, one.kv_heads, one.qkv_out, one.fc1_out, one.seq_in) == (
        1, 4, 2, (4 + 2 * 2) * 32, 2 * 512, 128)
    assert (two.tp, two.heads, two.kv_heads, two.qkv_out, two.fc1_out, two.seq_in) == (
        2, 2, 1, (2 + 2 * 1) * 32, 512, 64)
    assert two.sequence_parallel and not one.sequence_parallel
    prof = res.layer
    assert prof.device == "cpu" and prof.gpu_preset is None and prof.precision == "bf16"
    assert [(e.tp, e.cp, e.mbs, e.sequence_parallel) for e in prof.entries] == [
        (1, 1, 2, False), (2, 1, 2, True)]
    for e in prof.entries:   # wall-clock on a shared CPU: the order of the two may flip
        assert 0 < e.forward_s < 5.0 and 0 < e.backward_s < 5.0
        assert e.forward_s != e.backward_s
    assert res.comparison == () and "needs a GPU" in res.no_comparison
    # the file is the profile, and the loader reads it back unchanged
    back = load_profile(str(out))
    assert back.to_dict() == prof.to_dict()
    assert back.to_dict()["format"] == FORMAT
    assert back.lookup(2, 1, 2, True) == (prof.entries[1].forward_s,
                                          prof.entries[1].backward_s)
    assert back.lookup(1, 1, 2, True) == back.lookup(1, 1, 2, False)  # sp needs tp > 1
    assert back.lookup(4, 1, 2, True) is None
    model = make_model(**TINY)
    assert back.matches(model)
    back.check_model(model)
    with pytest.raises(InputError, match="profile.seq_length"):
        back.check_model(model.with_seq_length(256))
    text = format_profile(res)
    assert "fwd (ms)" in text and "needs a GPU" in text
    # the host's dispatch time per eager operation, measured and kept in the profile
    assert 0 < prof.host_op_us < 1000 and back.host_op_us == prof.host_op_us
    assert f"host: {prof.host_op_us:.2f} us to issue one eager operation" in text


def test_refuses_to_overwrite_before_running(tiny_yaml, tmp_path, monkeypatch):
    out = tmp_path / "profile.yaml"
    out.write_text("keep me")
    monkeypatch.setattr(profiler_layer, "build_layer", None)   # must not get that far
    with pytest.raises(InputError) as err:
        run_profile(_request(tiny_yaml, out))
    assert err.value.field == "out" and "--force" in str(err.value)
    assert out.read_text() == "keep me"


def test_cli_json_and_force(tiny_yaml, tmp_path, capsys):
    out = tmp_path / "p.json"
    out.write_text("old")
    p = Parser(prog="configurator profile")
    add_profile_arguments(p)
    args = p.parse_args(["--model", tiny_yaml, "--tp", "2", "--mbs", "1", "--seq-length",
                         "64", "--device", "cpu", "--warmup", "1", "--repeats", "2", "--out",
                         str(out), "--force", "--json"])
    assert run_profile_command(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["seq_length"] == 64 and printed["entries"][0]["tp"] == 2
    assert profile_from_dict(printed).to_dict() == printed
    assert json.loads(out.read_text()) == printed


def test_fp8_linear_matches_bf16_within_fp8_rounding():
    """The torch FP8 backend's GEMMs (E4M3 forward, E5M2 gradients, unit scales): output,
    data, weight and bias gradients within FP8 rounding of bf16 F.linear (E5M2 keeps 2
    mantissa bits: ~6 % relative), and far from it for a wrong operand order."""
    fn = profiler_layer.fp8_linear_fn(torch)
    torch.manual_seed(0)
    x = torch.randn(2, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    w = (0.5 * torch.randn(48, 64, dtype=torch.bfloat16)).requires_grad_(True)
    b = torch.zeros(48, dtype=torch.bfloat16, requires_grad=True)
    w8 = w.detach().to(torch.float8_e4m3fn)
    out = fn.apply(x, w, w8, w8.t().contiguous(), b)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    ref_out = torch.nn.functional.linear(*ref)
    ref_out.backward(grad)

    def rel(a, c):
        return float((a.detach().float() - c.float()).norm() / c.float().norm())

    assert out.shape == (2, 32, 48) and out.dtype == torch.bfloat16
    for got, want in ((out, ref_out), (x.grad, ref[0].grad), (w.grad, ref[1].grad)):
        assert got.shape == want.shape and rel(got, want) < 0.1
    assert rel(b.grad, ref[2].grad) < 1e-2
    assert rel(w.grad, ref[1].grad.t().reshape(48, 64)) > 0.5     # the check can fail


def test_fp8_profile_on_cpu_names_its_backend(tiny_yaml, tmp_path):
    res = run_profile(_request(tiny_yaml, tmp_path / "p.yaml", precision="fp8", tp=(1,)))
    assert res.layer.precision == "fp8" and "torch._scaled_mm" in res.layer.note
    assert load_profile(res.written).note == res.layer.note
    assert all(e.forward_s > 0 and e.backward_s > 0 for e in res.layer.entries)


def test_fp8_backend_refusals():
    class NoFloat8:
        __version__ = "1.13.0"

    with pytest.raises(InputError, match="^precision='fp8'.*float8") as err:
        fp8_backend(NoFloat8, torch.device("cpu"), "fp8")
    assert "\n" not in str(err.value)
    assert fp8_backend(torch, torch.device("cpu"), "bf16") == (None, None)


def test_layer_parameters_split_over_tp():
    """The layer built at tp 2 holds half the GEMM weights of tp 1 (norms are replicated)."""
    model = make_model(**TINY)
    sizes = {}
    for tp in (1, 2):
        shape = layer_shapes(model, tp, 1, 1, tp > 1)
        _, params, x, grad = profiler_layer.build_layer(torch, (None, None), model, shape,
                                                        torch.device("cpu"))
        sizes[tp] = sum(p.numel() for p in params if p.dim() == 2)
        assert x.shape == grad.shape == (1, shape.seq_in, 128)
    h, d = 128, 32
    assert sizes[1] == h * (4 + 2 * 2) * d + 4 * d * h + h * 2 * 512 + 512 * h
    assert sizes[2] == h * (2 + 2 * 1) * d + 2 * d * h + h * 512 + 256 * h


def test_layer_shapes_gqa_cp_and_refusals():
    model = make_model(**TINY)
    s = layer_shapes(model, 4, 2, 3, True)      # tp 4 > 2 query groups: one KV head each
    assert (s.heads, s.kv_heads, s.seq, s.seq_in, s.batch, s.cp) == (1, 1, 64, 16, 3, 2)
    with pytest.raises(InputError, match="^tp=3"):
        layer_shapes(model, 3, 1, 1, True)
    with pytest.raises(InputError, match="^sequence_parallel=True"):
        layer_shapes(model, 1, 1, 1, True)
    with pytest.raises(InputError, match="^model='deepseek-v3'.*multi-latent"):
        layer_shapes(MODEL_PRESETS["deepseek-v3"], 1, 1, 1, False)
    with pytest.raises(InputError, match="^model='gpt-oss-120b'.*sliding-window"):
        layer_shapes(MODEL_PRESETS["gpt-oss-120b"], 1, 1, 1, False)
    assert moe_note(model) is None
    assert "dense layer only" in moe_note(MODEL_PRESETS["mixtral-8x7b"])


@pytest.mark.parametrize("kw, field", [
    (dict(precision="fp8", seq_length=124), "precision"),   # _scaled_mm: sizes % 16
    (dict(repeats=0), "repeats"),
    (dict(tp=()), "tp"),
    (dict(gpu="h999"), "gpu"),
    (dict(cp=(3,)), "cp"),
])
def test_bad_requests_are_one_line_input_errors(tiny_yaml, tmp_path, kw, field):
    with pytest.raises(InputError) as err:
        run_profile(_request(tiny_yaml, tmp_path / "p.yaml", **kw))
    assert err.value.field == field and "\n" not in str(err.value)
    assert not (tmp_path / "p.yaml").exists()


GOOD = {"format": FORMAT, "device": "NVIDIA H100 80GB HBM3", "gpu_preset": "h100-80gb",
        "torch_version": "2.13.0", "model": "llama3-8b",
        "model_fingerprint": {"hidden_size": 4096, "num_layers": 32, "ffn_hidden_size": 14336,
                              "num_attention_heads": 32, "num_query_groups": 8,
                              "kv_channels": 128, "swiglu": True},
        "precision": "bf16", "seq_length": 8192,
        "entries": [{"tp": 1, "cp": 1, "mbs": 1, "sequence_parallel": False,
                     "forward_s": 0.012, "backward_s": 0.025},
                    {"tp": 2, "cp": 1, "mbs": 1, "sequence_parallel": True,
                     "forward_s": 0.007, "backward_s": 0.013}]}


def _set(path, value):
    def edit(d):
        *head, last = path
        for k in head:
            d = d[k]
        if value is KeyError:
            del d[last]
        else:
            d[last] = value
    return edit


@pytest.mark.parametrize("edit, field", [
    (_set(["format"], "configurator-profile/2"), "profile.format"),
    (_set(["device"], KeyError), "profile.device"),
    (_set(["colour"], "red"), "profile.colour"),
    (_set(["precision"], "fp16"), "profile.precision"),
    (_set(["seq_length"], "8k"), "profile.seq_length"),
    (_set(["gpu_preset"], ""), "profile.gpu_preset"),
    (_set(["model_fingerprint", "swiglu"], 1), "profile.model_fingerprint.swiglu"),
    (_set(["model_fingerprint", "hidden_size"], 0), "profile.model_fingerprint.hidden_size"),
    (_set(["model_fingerprint", "kv_channels"], KeyError),
     "profile.model_fingerprint.kv_channels"),
    (_set(["entries"], []), "profile.entries"),
    (_set(["entries", 0, "forward_s"], -1.0), "profile.entries[0].forward_s"),
    (_set(["entries", 0, "backward_s"], float("nan")), "profile.entries[0].backward_s"),
    (_set(["entries", 1, "tp"], 0), "profile.entries[1].tp"),
    (_set(["entries", 0, "sequence_parallel"], True), "profile.entries[0].sequence_parallel"),
    (_set(["entries", 1, "tp"], 1), "profile.entries[1].sequence_parallel"),
    (_set(["entries", 1], dict(GOOD["entries"][0])), "profile.entries[1]"),
    (_set(["entries", 0, "pp"], 2), "profile.entries[0].pp"),
    (_set(["note"], "two\nlines"), "profile.note"),
    (_set(["host_op_us"], 0.0), "profile.host_op_us"),
    (_set(["host_op_us"], "6us"), "profile.host_op_us"),
    (_set(["host_op_us"], 5000.0), "profile.host_op_us"),
])
def test_loader_rejects_malformed_profiles(tmp_path, edit, field):
    import yaml

    data = copy.deepcopy(GOOD)
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as err:
        load_profile(str(path))
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_loader_accepts_the_documented_example(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(GOOD))
    prof = load_profile(str(path))
    assert prof.path == str(path) and prof.lookup(2, 1, 1, True) == (0.007, 0.013)
    with pytest.raises(InputError, match="profile"):
        load_profile(str(tmp_path / "missing.yaml"))


def test_analytic_comparison_without_a_gpu():
    """The comparison a GPU run prints, from a profile's entries (no torch needed)."""
    model = MODEL_PRESETS["llama3-8b"]
    prof = profile_from_dict(GOOD)
    rows, why = analytic_comparison(model, prof, "h100-80gb")
    assert why is None and len(rows) == 2
    a, b = rows
    assert 0 < a.analytic_forward_s < a.analytic_backward_s
    assert b.analytic_forward_s < a.analytic_forward_s     # tp 2: half the FLOPs per rank
    fp8 = profile_from_dict(dict(GOOD, precision="fp8"))
    rows, why = analytic_comparison(model, fp8, "a100-80gb")
    assert rows == () and "fp8" in why
    text = format_profile(Profile(layer=prof, analytic_gpu="h100-80gb", comparison=rows or (
        analytic_comparison(model, prof, "h100-80gb")[0])))
    assert "analytic fwd (ms)" in text and "h100-80gb" in text


def test_gpu_preset_guess():
    assert guess_gpu_preset("NVIDIA H100 80GB HBM3") == "h100-80gb"
    assert guess_gpu_preset("NVIDIA H200") == "h200-141gb"
    assert guess_gpu_preset("NVIDIA GB200") == "gb200-186gb"
    assert guess_gpu_preset("NVIDIA B200") == "b200-180gb"
    assert guess_gpu_preset("NVIDIA B300 SXM6 AC") == "b300-288gb"
    assert guess_gpu_preset("NVIDIA GB300") == "gb300-288gb"
    assert guess_gpu_preset("NVIDIA A100-SXM4-80GB") == "a100-80gb"
    assert guess_gpu_preset("NVIDIA H100 PCIe") is None
    assert guess_gpu_preset("Tesla V100-SXM2-32GB") is None


def test_torch_stays_off_the_import_path():
    code = ("import sys, configurator.cli, configurator.app.profile_jobs, "
            "configurator.cli.profile_command, configurator.core.profile; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr


def test_estimate_and_search_use_the_profiled_layer_times(tmp_path):
    """--profile replaces the analytic layer forward/backward where the profile holds the
    plan's shape: 32 layers × (fwd + bwd) × microbatches, plus the untouched embedding,
    output layer, main-gradient accumulation and optimizer; a profile of another model, GPU or precision is refused."""
    from tests.conftest import run_cli

    path = tmp_path / "prof.json"
    path.write_text(json.dumps(GOOD))
    base = ("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "1",
            "--gbs", "16", "--pp", "1", "--mbs", "1", "--json")
    out = {}
    for tp in (1, 2, 4):
        for prof in ((), ("--profile", str(path))):
            res = run_cli(*base, "--tp", str(tp), *prof)
            assert res.returncode == 0, res.stderr
            out[tp, bool(prof)] = json.loads(res.stdout)["time_breakdown_s"]
    m = 16 // 8      # microbatches per rank at tp 1 (dp 8)
    delta = out[1, True]["compute"] - out[1, False]["compute"]
    from configurator.cost.compute import layer_costs
    from configurator.core.plan_batch import PlanBatch
    from configurator.core.plan import ParallelPlan
    from topology.gpus import GPU_PRESETS

    lc = layer_costs(MODEL_PRESETS["llama3-8b"], PlanBatch.from_plan(ParallelPlan(
        tp=1, dp=8, micro_batch_size=1, global_batch_size=16)), GPU_PRESETS["h100-80gb"])
    # the profile replaces the layer's own time; Megatron's main-gradient accumulation, which
    # a profiled torch layer does not do, stays on top of it
    analytic = float(lc["fwd"][0] + lc["bwd"][0] - lc["main_grad_acc"][0])
    assert delta == pytest.approx(32 * m * ((0.012 + 0.025) - analytic), rel=1e-6)
    assert out[2, True]["compute"] != out[2, False]["compute"]        # tp 2 entry (SP on)
    assert out[4, True] == out[4, False]                              # no tp 4 entry
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                  "1", "--gbs", "16", "--json", "--profile", str(path))
    assert res.returncode == 0, res.stderr
    refused = (([x.replace("llama3-8b", "llama3-70b") for x in base] + ["--tp", "8"],
                "profile.model_fingerprint.hidden_size"),
               (list(base) + ["--tp", "1", "--precision", "fp8"], "profile.precision"))
    for argv, field in refused:
        res = run_cli(*argv, "--profile", str(path))
        assert res.returncode == 2 and res.stdout == "", res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and field in res.stderr
    other = dict(GOOD, gpu_preset="a100-80gb")
    path.write_text(json.dumps(other))
    res = run_cli(*base, "--tp", "1", "--profile", str(path))
    assert res.returncode == 2 and "profile.gpu_preset" in res.stderr


def test_host_op_timing_counts_each_operation_of_the_loop(monkeypatch):
    """The timed loop issues HOST_LOOP_OPS operations and divides by that count: a clock
    that advances 1 s per operation issued gives 1 s per operation."""
    import torch

    from configurator.profiler import host_ops

    clock = {"t": 0.0}
    real_mul = torch.Tensor.__mul__
    real_add = torch.Tensor.__add__

    def tick(fn):
        def op(self, other):
            clock["t"] += 1.0
            return fn(self, other)
        return op

    monkeypatch.setattr(torch.Tensor, "__mul__", tick(real_mul))
    monkeypatch.setattr(torch.Tensor, "__add__", tick(real_add))
    monkeypatch.setattr(host_ops.time, "perf_counter", lambda: clock["t"])
    per_op = host_ops.time_host_op_s(torch, torch.device("cpu"), warmup=1, repeats=3)
    assert per_op == 1.0


def test_a_profiled_host_time_replaces_the_presets_and_a_calibration_wins(tmp_path):
    """A profile's host_op_us (dispatch per eager operation on the user's host) sets the
    host time per operation of a training step, × the in-training host factor; the host-bound
    plans get slower with a slower host; a calibration's host_op_us applied after it wins."""
    from configurator.app.inputs import JobInputs, resolve
    from topology.gpus import IN_TRAINING

    path = tmp_path / "prof.json"
    slow = dict(GOOD, host_op_us=400.0)
    path.write_text(json.dumps(slow))
    inputs = dict(model="llama3-8b", cluster="dgx-h100-80gb", nodes=1)
    preset = resolve(JobInputs(**inputs)).cluster
    job = resolve(JobInputs(**inputs, profile=str(path)))
    profiled, prof = job.cluster, job.profile
    assert prof.host_op_us == 400.0
    assert profiled.gpu.efficiency.host_op_s == pytest.approx(400.0 * IN_TRAINING["host"] * 1e-6)
    assert preset.gpu.efficiency.host_op_s != profiled.gpu.efficiency.host_op_s
    assert "profile" in profiled.gpu.efficiency.source
    cal = tmp_path / "cal.yaml"
    cal.write_text("format: configurator-calibration/1\ngpus:\n  h100-80gb:\n"
                   "    bf16:\n      host_op_us: 3.0\n")
    both = resolve(JobInputs(**inputs, profile=str(path), calibration=str(cal))).cluster
    assert both.gpu.efficiency.host_op_s == pytest.approx(3.0e-6)
    without_host = tmp_path / "plain.json"
    without_host.write_text(json.dumps(GOOD))
    plain = resolve(JobInputs(**inputs, profile=str(without_host))).cluster
    assert plain.gpu.efficiency.host_op_s == preset.gpu.efficiency.host_op_s
    # a layer with no profiled entry (tp 8) is priced analytically, its host floor from the
    # profiled host: 400 us of dispatch (a host far slower than the preset) sets its pace
    from tests.conftest import run_cli

    argv = ("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "1",
            "--gbs", "8", "--tp", "8", "--pp", "1", "--mbs", "1", "--json")
    times = [json.loads(run_cli(*argv, *extra).stdout)["iteration_time_s"]
             for extra in ((), ("--profile", str(path)))]
    assert times[1] > 1.2 * times[0]
