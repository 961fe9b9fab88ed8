"""Model steps as data (aot/steps.py): the committed step files, the builder op by op, bad files in one line."""

import json
from collections import Counter

import pytest
from helpers.fake_step import HAND_MODEL as HAND

from skinny_gemm.aot import plans, steps
from skinny_gemm.aot.steps import Op, StepError
from skinny_gemm.runtime import modelfile

STEP_FILES = sorted(p for p in modelfile.MODELS_DIR.glob("*.json") if "step" in json.loads(p.read_text()))


def test_the_step_files_cover_glm_and_the_dense_models():
    names = {p.stem for p in STEP_FILES}
    assert {"glm-5.3-flash", "llama-3.1-8b", "qwen3-32b", "llama-3.1-70b"} <= names


@pytest.mark.parametrize("path", STEP_FILES, ids=lambda p: p.stem)
def test_every_step_file_parses_and_its_projections_are_the_linears(path):
    model = steps.load(path)
    arch = "sm_90a" if "seed_plan_sets" in model else None
    for tp in model["step"]["tp"]:
        for m in (1, 16):
            ops = steps.build(model, tp, m, arch=arch)
            # Every linear appears calls_per_step times, as a GEMM or (another dtype) as a weight read.
            per_linear = Counter(op.name for op in ops if op.kind in ("gemm", "weight_read"))
            assert per_linear == {
                name: lin["calls_per_step"] for name, lin in model["linears"].items() if lin.get("kind") != "router"
            }
            for op in ops:
                if op.kind in ("gemm", "weight_read"):
                    assert [op.n, op.k] == model["linears"][op.name]["tp"][str(tp)]
                else:
                    assert op.bytes > 0
            assert ("all_reduce" in {op.kind for op in ops}) == (tp > 1), "an all-reduce placeholder only where TP > 1"
            # No two GEMMs of the step without an op between them outside a layer's projections: the
            # last op before the LM head is the final norm.
            assert ops[next(i for i, op in enumerate(ops) if op.name == "lm_head") - 1].kind == "rms_norm"


def _old_glm_order(lin, tp):
    """The interleave aot/plans.py held in code before the step file: three KDA layers, one MLA, ..., LM head."""
    kda = ("kda_in_proj", "kda_f_b_proj", "kda_g_b_proj", "kda_o_proj")
    mla = ("mla_fused_qkv_a", "mla_q_b_proj", "indexer_wq_b", "indexer_wk", "mla_o_proj")
    order, k_left, m_left = [], 34, 11
    while k_left or m_left:
        for _ in range(min(3, k_left)):
            order += [(name, *lin[name]["tp"][str(tp)]) for name in kda]
            k_left -= 1
        if m_left:
            order += [(name, *lin[name]["tp"][str(tp)]) for name in mla]
            m_left -= 1
    return order + [("lm_head", *lin["lm_head"]["tp"][str(tp)])]


def test_glm_step_is_todays_decode_order():
    model = steps.load("glm-5.3-flash")
    assert model["step"]["tp"] == [4, 8]
    for tp in (4, 8):
        order = plans.decode_order(model, tp)
        assert len(order) == 192
        assert order == _old_glm_order(model["linears"], tp)
        ops = steps.build(model, tp, 1, arch="sm_90a")
        # The FP8 checkpoint's shared experts are not our GEMMs: they read their FP8 bytes.
        reads = [op for op in ops if op.kind == "weight_read"]
        assert {op.name for op in reads} == {"shared_gate_up", "shared_down"}
        assert all(op.bytes == op.n * op.k for op in reads)
        assert Counter(op.kind for op in ops)["recurrent"] == 34 and Counter(op.kind for op in ops)["attention"] == 11
    assert sum(n * k * 2 for _, n, k in plans.decode_order(model, 4)) == 3_555_196_928  # 3.555 GB in TP4's 192 GEMMs


def test_builder_gives_the_ops_and_sizes_op_by_op():
    steps.validate(HAND, "hand.json")
    layer_tp1_m2 = [
        Op("add_rms_norm", "layer.add_rms_norm", size=64, bytes=2 * 64 * 2),
        Op("gemm", "qkv", n=96, k=64),
        Op("rotary", "layer.rotary", size=32, bytes=2 * 32 * 2),
        Op("attention", "layer.attention", bytes=2 * 10 * 40),
        Op("recurrent", "layer.recurrent", bytes=2 * 1000),
        Op("moe", "layer.moe", bytes=4 * 7),  # min(4 experts, 2 tokens x top 3) experts
        Op("weight_read", "down", n=64, k=128, bytes=64 * 128),
    ]
    tail = [Op("silu_and_mul", "silu_and_mul", size=8, bytes=2 * 8 * 2), Op("gemm", "head", n=500, k=64)]
    assert steps.build(HAND, 1, 2) == layer_tp1_m2 * 2 + tail, "TP 1: no all-reduce"
    tp2 = steps.build(HAND, 2, 1)
    assert tp2[:8] == [
        Op("add_rms_norm", "layer.add_rms_norm", size=64, bytes=128),
        Op("gemm", "qkv", n=48, k=64),
        Op("rotary", "layer.rotary", size=16, bytes=32),
        Op("attention", "layer.attention", bytes=10 * 20),
        Op("recurrent", "layer.recurrent", bytes=1000),
        Op("moe", "layer.moe", bytes=3 * 5),
        Op("weight_read", "down", n=64, k=64, bytes=64 * 64),
        Op("all_reduce", "layer.all_reduce", size=64, bytes=128),
    ]
    assert len(tp2) == 18 and steps.gemm_calls(tp2) == [("qkv", 48, 64)] * 2 + [("head", 250, 64)]
    assert steps.to_json(tp2[:2]) == [{"op": "add_rms_norm", "size": 64, "bytes": 128}, ["gemm", 48, 64]]
    # A chosen GEMM set: "down" as ours too.
    assert [op.kind for op in steps.build(HAND, 1, 1, gemms={"qkv", "down", "head"})][6] == "gemm"
    with pytest.raises(StepError, match="stated for TP"):
        steps.build(HAND, 4, 1)


def _bad(tmp_path, mutate):
    data = json.loads(json.dumps(HAND))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(StepError) as exc:
        steps.load(path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    return msg


def test_a_bad_step_file_is_one_line_naming_the_file_and_the_entry(tmp_path):
    def unknown_op(d):
        d["step"]["layers"]["layer"][2]["op"] = "rmsnorm"

    assert "step.layers.layer[2]: unknown op 'rmsnorm'" in _bad(tmp_path, unknown_op)

    def no_shape(d):
        d["linears"]["qkv"]["tp"].pop("2")

    assert "step.layers.layer[1]: linear 'qkv' has no runnable (N, K) at TP 2" in _bad(tmp_path, no_shape)

    def zero_shape(d):
        d["linears"]["head"]["tp"]["1"] = [0, 64]

    assert "step.sequence[2]: linear 'head' has no runnable (N, K) at TP 1" in _bad(tmp_path, zero_shape)

    def missing_tp_size(d):
        d["step"]["layers"]["layer"][2]["size"] = {"1": 32}

    assert "rotary.size at TP 2" in _bad(tmp_path, missing_tp_size)

    def unknown_layer(d):
        d["step"]["sequence"][0]["body"][0]["layer"] = "mlp"

    assert "step.sequence[0].body[0]: unknown layer 'mlp'" in _bad(tmp_path, unknown_layer)

    def no_about(d):
        del d["step"]["about"]

    assert "step.about" in _bad(tmp_path, no_about)

    def no_context(d):
        del d["step"]["context"]

    assert "step.context" in _bad(tmp_path, no_context)

    def extra_field(d):
        d["step"]["layers"]["layer"][0]["bytes"] = 3

    assert "has unknown ['bytes']" in _bad(tmp_path, extra_field)
    path = tmp_path / "broken.json"
    path.write_text('{"step": [')
    with pytest.raises(StepError) as exc:
        steps.load(path)
    assert str(exc.value).startswith(f"{path}: unreadable model file (") and "\n" not in str(exc.value)


def test_decode_steps_without_a_step_are_empty(tmp_path):
    path = tmp_path / "shapes.json"
    model = json.loads((modelfile.MODELS_DIR / "glm-5.3-flash.json").read_text())
    path.write_text(json.dumps(model))
    assert sorted(plans.decode_steps("sm_90a", path)) == [4, 8]
    assert plans.decode_steps("sm_121", path) == {}, "the step is stated for TP 4 and 8, the sm_121 set is TP 2"
    del model["step"]
    path.write_text(json.dumps(model))
    assert plans.decode_steps("sm_90a", path) == {}
