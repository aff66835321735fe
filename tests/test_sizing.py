"""`recommend`: memory against DeepSpeed's estimator and the ZeRO paper, offerings, ranking by job cost."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from gpucluster import catalog
from gpucluster.preflight import parse_stack_config
from gpucluster.sizing import (
    GIB,
    MODELS,
    Fit,
    SizingError,
    Workload,
    decode_rate,
    estimate_memory,
    make_workload,
    multi_node_capable,
    node_group_snippet,
    orderable,
    parse_params,
    parse_tokens,
    recommend,
    recommendation_snippet,
    usable_gib_per_gpu,
)

# ------------------------------------------------------- DeepSpeed's ZeRO-3 estimator


def deepspeed_zero3_gpu_bytes(total_params: int, largest_layer_params: int, num_gpus_per_node: int,
                              num_nodes: int = 1) -> int:
    """DeepSpeed's per-GPU figure, reproduced from microsoft/DeepSpeed deepspeed/runtime/zero/stage3.py.

    `estimate_zero3_model_states_mem_needs_all_live(model, ...)` takes total_params and
    largest_layer_params from the model (`model_to_params`) and calls
    `estimate_zero3_model_states_mem_needs`, whose branch without offload (cpu_offload=False) is
        largest_layer_memory = (4 * largest_layer_params)
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
    """
    total_gpus = num_nodes * num_gpus_per_node
    largest_layer_memory = 4 * largest_layer_params
    return largest_layer_memory + int(18 * total_params / total_gpus)


def test_the_reproduced_formula_gives_deepspeeds_printed_figure() -> None:
    """DeepSpeed's own output for t5-small on 1 GPU, as published (blog.csdn.net/u012327567/article/
    details/132278598): "Model with 60M total params, 16M largest layer params ... 0.09GB | 1.08GB |
    offload_param=none, offload_optimizer=none, zero_init=1"."""
    # t5-small (AutoModel): 60,506,624 parameters, the largest module the 32128 x 512 shared embedding
    gpu = deepspeed_zero3_gpu_bytes(60_506_624, 32_128 * 512, num_gpus_per_node=1)
    assert f"{gpu / 2**30:6.2f}GB" == "  1.08GB"


# model, total parameters as the Hugging Face model page counts them (safetensors), the largest
# module's parameters (the vocab x hidden embedding, from config.json), GPUs
DEEPSPEED_TABLE: list[tuple[str, int, int, int]] = [
    ("llama-3.2-1b", 1_235_814_400, 128_256 * 2048, 1),
    ("llama-3.2-3b", 3_212_749_824, 128_256 * 3072, 4),
    ("llama-3.1-8b", 8_030_261_248, 128_256 * 4096, 8),
    ("llama-3.1-70b", 70_553_706_496, 128_256 * 8192, 32),
    ("llama-3.1-70b", 70_553_706_496, 128_256 * 8192, 64),
    ("llama-3.1-405b", 405_853_388_800, 128_256 * 16384, 128),
    ("mistral-7b", 7_241_732_096, 32_000 * 4096, 8),
    ("mixtral-8x7b", 46_702_792_704, 32_000 * 4096, 16),
    ("mixtral-8x22b", 140_620_634_112, 32_000 * 6144, 64),
    ("qwen2.5-7b", 7_615_616_512, 152_064 * 3584, 8),
    ("qwen2.5-72b", 72_706_203_648, 152_064 * 8192, 64),
]


@pytest.mark.parametrize(("model", "total", "largest", "gpus"), DEEPSPEED_TABLE)
def test_model_states_match_deepspeeds_estimator_within_5_percent(model: str, total: int, largest: int,
                                                                   gpus: int) -> None:
    expected = deepspeed_zero3_gpu_bytes(total, largest, num_gpus_per_node=min(gpus, 8),
                                         num_nodes=max(1, gpus // 8))
    memory = estimate_memory(make_workload(model=model, mode="train"))
    assert memory.model_states_per_gpu(gpus) == pytest.approx(expected, rel=0.05)
    assert memory.largest_module == pytest.approx(4 * largest, rel=0.05)  # the embedding, not a layer


def test_zero_paper_table_1() -> None:
    """ZeRO (Rajbhandari et al. 2020) Table 1: 7.5B parameters, K = 12, 64 GPUs: 120 GB baseline, 1.88 GB
    per GPU with P_os+g+p. Those are the paper's 16 B; DeepSpeed's estimator adds 2 B (buffers)."""
    m = estimate_memory(make_workload("7.5b", "train", layers=32, hidden=4096))
    paper = m.weights + m.gradients + m.optimizer
    assert paper == pytest.approx(120e9, rel=0.05)
    assert paper / 64 == pytest.approx(1.88e9, rel=0.05)
    assert m.buffers == pytest.approx(2 * 7.5e9)


def test_parameter_counts_from_config_match_the_published_ones() -> None:
    published = {model: total for model, total, _, _ in DEEPSPEED_TABLE}
    assert {name: int(m.params) for name, m in MODELS.items()} == published
    assert MODELS["mixtral-8x7b"].active_params == pytest.approx(12.9e9, rel=0.01)   # two of 8 experts
    assert MODELS["mixtral-8x22b"].active_params == pytest.approx(39.2e9, rel=0.01)
    assert all(m.source.startswith("huggingface.co/") and m.source.endswith("/config.json")
               for m in MODELS.values())


# ---------------------------------------------------------------- the cases


def test_llama3_8b_full_finetune_does_not_fit_24_gb_cards() -> None:
    """Issue 15: the old 16 B/param + one layer said 17.4 of 20.1 GiB on 8 x L4; it is ~22.3."""
    w = make_workload(model="llama-3.1-8b", mode="finetune")
    m = estimate_memory(w)
    p, embedding = 8_030_261_248, 128_256 * 4096
    deepspeed = 18 * p / 8 + 4 * embedding
    activations = 4096 * 1 * 4096 * (2 * 32 + 34)                 # s*b*h*(2L + 34), 16-bit
    logits = 4096 * 128_256 * 4                                     # fp32 logits, ~1.96 GiB
    assert m.per_gpu_need(8) == pytest.approx(deepspeed + activations + logits)
    assert m.per_gpu_need(8) / GIB == pytest.approx(22.27, abs=0.01)
    fits = {f.instance_type for f in recommend(w)}
    for name in ("g6.48xlarge", "g5.48xlarge"):                     # 8 x L4, 8 x A10G
        assert m.per_gpu_need(8) / GIB > usable_gib_per_gpu(catalog.get(name))  # type: ignore[arg-type]
        assert name not in fits


def test_llama3_70b_training_needs_six_p4d_not_five() -> None:
    w = make_workload(model="llama-3.1-70b", mode="train")
    m = estimate_memory(w)
    p4d = usable_gib_per_gpu(catalog.get("p4d.24xlarge"))  # type: ignore[arg-type]
    assert p4d == pytest.approx((40 - 1) * 0.95)
    assert m.per_gpu_need(40) / GIB > p4d >= m.per_gpu_need(48) / GIB
    assert next(f for f in recommend(w) if f.instance_type == "p4d.24xlarge").nodes == 6


def test_inference_holds_the_kv_cache_of_every_concurrent_sequence() -> None:
    w = make_workload(model="llama-3.1-70b", mode="inference", seq_len=8192, concurrency=16)
    m = estimate_memory(w)
    assert m.kv_cache == 2 * 80 * 8 * 128 * 8192 * 16 * 2          # GQA: 8 KV heads, 16 sequences
    assert m.weights == 2 * 70_553_706_496 and m.overhead == pytest.approx(0.2 * m.weights)
    assert make_workload(model="llama-3.1-70b", mode="inference").concurrency == 8  # the default


def test_mixture_of_experts_holds_every_expert_and_computes_with_two() -> None:
    w = make_workload(model="mixtral-8x7b", mode="inference", tokens="1b")
    assert estimate_memory(w).weights == 2 * 46_702_792_704
    assert w.flops == pytest.approx(2 * 12_879_925_248 * 1e9)


def test_t4_has_no_bf16_but_runs_int8_weights_in_fp16() -> None:
    assert "g4dn.xlarge" not in {f.instance_type for f in recommend(make_workload(model="mistral-7b",
                                                                                  mode="inference"))}
    fits = recommend(make_workload(model="llama-3.2-3b", mode="inference", precision="int8"))
    t4 = next(f for f in fits if f.instance_type == "g4dn.xlarge")
    assert (t4.compute_format, t4.peak_tflops_per_gpu) == ("fp16", 65)


# ------------------------------------------------------------------------ offerings


@pytest.mark.parametrize("region", ["us-east-1", "us-west-2"])
@pytest.mark.parametrize(("model", "mode"), [("llama-3.1-8b", "finetune"), ("llama-3.1-70b", "train"),
                                             ("llama-3.1-405b", "inference"), ("mixtral-8x22b", "inference"),
                                             ("llama-3.2-1b", "inference")])
def test_recommend_never_returns_a_type_not_offered(region: str, model: str, mode: str) -> None:
    fits = recommend(make_workload(model=model, mode=mode), region)
    assert fits
    for f in fits:
        assert catalog.offered_zones(f.instance_type, region), f"{f.instance_type} not offered in {region}"
    if region == "us-east-1":
        assert "p5e.48xlarge" not in {f.instance_type for f in fits}


def test_a_zone_narrows_to_the_types_offered_there() -> None:
    w = make_workload(model="llama-3.1-70b", mode="train")
    everywhere = {f.instance_type for f in recommend(w, "us-east-1")}
    in_1a = {f.instance_type for f in recommend(w, "us-east-1", "us-east-1a")}
    assert "p4de.24xlarge" in everywhere and "p4de.24xlarge" not in in_1a       # us-east-1b/1c only
    assert "p6-b200.48xlarge" in everywhere and "p6-b200.48xlarge" not in in_1a  # us-east-1c only
    assert all("us-east-1a" in (catalog.offered_zones(t, "us-east-1") or []) for t in in_1a)
    with pytest.raises(SizingError, match=r"--zone: 'us-west-2a' is not a zone of region 'us-east-1'"):
        recommend(w, "us-east-1", "us-west-2a")


def test_capacity_block_only_types_are_priced_as_blocks_and_bought_not_pasted() -> None:
    w = make_workload(model="llama-3.1-405b", mode="inference")
    fits = recommend(w, "us-west-2")
    p5e = next(f for f in fits if f.instance_type == "p5e.48xlarge")
    assert (p5e.price_basis, p5e.usd_per_hour, p5e.spot_usd_per_hour) == ("capacity block", 38.0, None)
    snippet = node_group_snippet(p5e, w, "us-west-2")
    assert "gpucluster capacity search --type p5e.48xlarge --count 1 --days 7 --region us-west-2" in snippet
    assert all(line.startswith("#") for line in snippet.splitlines())  # nothing to paste before buying


# -------------------------------------------------------------------- job cost


def test_ranking_by_job_cost_worked_case() -> None:
    """Llama 3.1 8B full fine-tuning on 1B tokens at 40 % MFU in us-east-1.

    FLOPs = 6 x 8,030,261,248 x 1e9 = 4.818e19.
    p5.48xlarge:  8 x 989 TFLOPS x 0.4 = 3,164.8 effective -> 4.229 h x $55.04 = $232.76.
    g6e.12xlarge: 4 x 362.05 x 0.4 = 579.28 effective -> 23.10 h x $10.49264 = $242.42.
    The g6e costs a fifth per hour and would rank first by hourly price; the p5 job is cheaper.
    """
    w = make_workload(model="llama-3.1-8b", mode="finetune", tokens="1b")
    fits = {f.instance_type: f for f in recommend(w)}
    flops = 6 * 8_030_261_248 * 1e9
    p5, g6e = fits["p5.48xlarge"], fits["g6e.12xlarge"]
    assert p5.effective_tflops == pytest.approx(3164.8) and g6e.effective_tflops == pytest.approx(579.28)
    assert p5.hours == pytest.approx(flops / 3164.8e12 / 3600) == pytest.approx(4.229, abs=1e-3)
    assert p5.job_usd == pytest.approx(p5.hours * 55.04) == pytest.approx(232.76, abs=0.01)
    assert g6e.job_usd == pytest.approx(flops / 579.28e12 / 3600 * 10.49264)
    assert g6e.job_usd == pytest.approx(242.42, abs=0.01)
    ranked = [f.instance_type for f in recommend(w)]
    assert ranked.index("p5.48xlarge") < ranked.index("g6e.12xlarge")
    assert g6e.usd_per_hour < p5.usd_per_hour
    costs = [f.job_usd for f in recommend(w)]
    assert costs == sorted(costs)                                      # type: ignore[type-var]


def test_without_tokens_rank_by_price_per_effective_tflop_hour() -> None:
    fits = recommend(make_workload(model="llama-3.1-8b", mode="finetune", mfu=0.5))
    assert all(f.hours is None and f.job_usd is None for f in fits)
    per = [f.usd_per_effective_tflop_hour for f in fits]
    assert per == sorted(per)
    p5 = next(f for f in fits if f.instance_type == "p5.48xlarge")
    assert p5.usd_per_effective_tflop_hour == pytest.approx(55.04 / (8 * 989 * 0.5))


def test_inference_is_timed_by_memory_bandwidth() -> None:
    """Decode on one L40S (864 GB/s, NVIDIA L40S data sheet) at 60 % of it: each step reads the
    bf16 weights and the 8 sequences' KV cache at half length, and emits 8 tokens."""
    w = make_workload(model="llama-3.1-8b", mode="inference", tokens="10b")
    g6 = next(f for f in recommend(w) if f.instance_type == "g6e.xlarge")
    params = 8_030_261_248
    kv_cache = 2 * 32 * 8 * 128 * 4096 * 8 * 2  # layers, KV heads, head dim, tokens, sequences, bf16
    step = (2 * params + kv_cache / 2) / (864e9 * 0.6)
    assert g6.tensor_parallel == 1
    assert g6.tokens_per_second == pytest.approx(8 / step)
    assert g6.hours == pytest.approx(10e9 / (8 / step) / 3600)
    assert g6.usd_per_million_tokens == pytest.approx(g6.usd_per_hour / (8 / step * 3600) * 1e6)
    assert g6.job_usd == pytest.approx(g6.hours * g6.usd_per_hour)


def test_a_compute_bound_step_takes_its_flops_time() -> None:
    """Many sequences at once: the FLOPs (2 per active parameter per token) outlast the reads."""
    w = make_workload(model="llama-3.2-1b", mode="inference", concurrency=4096, seq_len=128)
    t = catalog.get("g6e.xlarge")
    gpu = catalog.gpu_model("L40S")
    assert t is not None and gpu is not None
    rate, tp = decode_rate(w, t, gpu, 1, 362.05)
    assert tp == 1
    assert rate == pytest.approx(4096 / (2 * w.model.active_params * 4096 / (362.05e12 * 0.4)))


def test_inference_for_an_8b_model_ranks_what_users_would_pick() -> None:
    """Issue 25: by cost per generated token an 8B model is served on one GPU; an 8 x B200 node,
    $113.93/h, does not rank above a $1.86/h g6e."""
    fits = recommend(make_workload(model="llama-3.1-8b", mode="inference"))
    order = [f.instance_type for f in fits]
    assert fits[0].price_basis == "on-demand" and fits[0].gpus == 1
    assert order.index("g6e.xlarge") < order.index("p6-b200.48xlarge")
    assert order.index("g6e.xlarge") < order.index("p5.48xlarge")
    assert [f.usd_per_million_tokens for f in fits] == sorted(f.usd_per_million_tokens for f in fits)


def test_every_gpu_model_has_a_sourced_bandwidth() -> None:
    for name, gpu in catalog.gpu_models().items():
        assert gpu.memory_bandwidth_gbs and "data sheet" in gpu.bandwidth_source, name
    assert catalog.gpu_model("A100").bandwidth_gbs(40960) == 1555  # p4d: A100 40 GB
    assert catalog.gpu_model("A100").bandwidth_gbs(81920) == 2039  # p4de: A100 80 GB
    assert catalog.gpu_model("H100").bandwidth_gbs(81920) == 3350


def test_a_capacity_block_pick_comes_with_a_node_group_to_order_now() -> None:
    w = make_workload(model="llama-3.1-70b", mode="inference")
    fits = recommend(w)
    on_demand = fits[0]
    block = replace(next(f for f in fits if f.instance_type.startswith("p5")), price_basis="capacity block")
    text = recommendation_snippet([block, on_demand], w)
    assert text is not None
    assert f"gpucluster capacity search --type {block.instance_type}" in text
    assert "# or now, on demand (no block to buy)" in text
    pasted = yaml.safe_load(text.split("# or now, on demand", 1)[1].split("\n", 1)[1])
    assert pasted["gpucluster:node_groups"][0]["instance_types"] == [on_demand.instance_type]
    assert orderable([block, on_demand]) is on_demand
    assert "# or now" not in (recommendation_snippet([on_demand, block], w) or "")


# ----------------------------------------------------------------- snippets, input


def test_multi_node_type_rules() -> None:
    capable = {n for n in catalog.names() if multi_node_capable(catalog.get(n))}  # type: ignore[arg-type]
    assert {"p5.48xlarge", "p4d.24xlarge", "g6e.24xlarge", "g6e.48xlarge"} <= capable
    assert not capable & {"p5.4xlarge", "g6e.12xlarge", "g5.48xlarge", "g4dn.metal", "g5.xlarge"}
    for f in recommend(make_workload(model="llama-3.1-405b", mode="train")):
        assert f.nodes == 1 or multi_node_capable(catalog.get(f.instance_type))  # type: ignore[arg-type]


@pytest.mark.parametrize(("model", "mode", "zone"), [
    ("mistral-7b", "inference", None), ("llama-3.1-8b", "finetune", None), ("llama-3.1-70b", "train", None),
    ("llama-3.1-405b", "train", None), ("llama-3.1-70b", "train", "us-east-1b")])
def test_snippet_is_a_valid_node_group(base_config: dict[str, Any], model: str, mode: str,
                                       zone: str | None) -> None:
    w: Workload = make_workload(model=model, mode=mode)
    fit: Fit = recommend(w, zone=zone)[0]
    pasted = yaml.safe_load(node_group_snippet(fit, w, zone=zone))
    group = pasted["gpucluster:node_groups"][0]
    base_config["gpucluster:network"]["availability_zones"] = group["availability_zones"]
    base_config.update(pasted)
    spec = parse_stack_config(base_config, stack="t")  # the offerings check included
    parsed = spec.node_groups[0]
    assert parsed.instance_types == [fit.instance_type]
    assert parsed.desired_nodes == parsed.max_nodes == fit.nodes
    assert parsed.efa_enabled == (fit.nodes > 1)
    assert parsed.capacity.spot_percent == (0 if fit.nodes > 1 or not w.training else 100)
    zones = spec.azs_of(parsed)
    assert all(z in (catalog.offered_zones(fit.instance_type, "us-east-1") or []) for z in zones)
    if zone:
        assert zones == [zone]


@pytest.mark.parametrize(("text", "billions"), [("7", 7.0), ("70b", 70.0), ("405B", 405.0),
                                                 ("1.5t", 1500.0), ("350m", 0.35)])
def test_parse_params(text: str, billions: float) -> None:
    assert parse_params(text) == pytest.approx(billions)


@pytest.mark.parametrize(("text", "tokens"), [("2t", 2e12), ("500b", 5e11), ("1e9", 1e9), ("300M", 3e8),
                                              ("1000000", 1e6)])
def test_parse_tokens(text: str, tokens: float) -> None:
    assert parse_tokens(text) == pytest.approx(tokens)


@pytest.mark.parametrize("text", ["2", "500", "999999", "2.5"])
def test_a_bare_small_token_count_is_refused_with_a_hint(text: str) -> None:
    """`--tokens 2` meant 2t or 2b: a unitless count under a million cannot be a real job."""
    with pytest.raises(SizingError) as raised:
        parse_tokens(text)
    assert raised.value.option == "--tokens"
    assert f"{text} has no unit: did you mean {text}t" in str(raised.value)


def test_cli_tokens_2_exits_2_with_the_hint() -> None:
    from typer.testing import CliRunner

    from gpucluster.cli import app

    result = CliRunner().invoke(app, ["recommend", "--model", "llama-3.1-8b", "--mode", "train",
                                      "--tokens", "2"])
    assert result.exit_code == 2
    assert " ".join(result.output.split()).startswith(
        "recommend: --tokens: 2 has no unit: did you mean 2t (2 trillion) or 2b (2 billion)?")


def test_params_alone_picks_the_model_of_that_size() -> None:
    assert make_workload("70b", "train").model is MODELS["llama-3.1-70b"]
    assert make_workload("8", "train").model is MODELS["llama-3.1-8b"]
    assert make_workload(model="Llama-3.3-70B", mode="train").model is MODELS["llama-3.1-70b"]


@pytest.mark.parametrize(("kwargs", "option", "words"), [
    ({"params": "seven", "mode": "train"}, "--params", "positive parameter count"),
    ({"params": "0", "mode": "train"}, "--params", "positive parameter count"),
    ({"mode": "train"}, "--params", "give --model NAME or --params"),
    ({"model": "gpt-5", "mode": "train"}, "--model", "unknown model 'gpt-5' (known: llama-3.2-1b"),
    ({"model": "mistral-7b", "params": "7", "mode": "train"}, "--model", "give --model alone"),
    ({"params": "7", "mode": "fly"}, "--mode", "train, finetune, lora, qlora, inference"),
    ({"params": "7", "mode": "train", "precision": "int4"}, "--precision", "bf16, fp16, fp32"),
    ({"params": "30", "mode": "train"}, "--layers", "no known shape for a 30B model"),
    ({"params": "30", "mode": "train", "layers": 60}, "--hidden", "give both"),
    ({"params": "30", "mode": "train", "layers": 60, "hidden": 6656, "heads": 52, "kv_heads": 5},
     "--kv-heads", "must divide --heads (52)"),
    ({"params": "30", "mode": "train", "layers": 60, "hidden": 6656, "heads": 50}, "--heads",
     "must divide --hidden"),
    ({"params": "7", "mode": "train", "batch": 0}, "--batch", "must be 1..4096"),
    ({"params": "7", "mode": "inference", "batch": 4}, "--batch", "inference takes --concurrency"),
    ({"params": "7", "mode": "train", "concurrency": 4}, "--concurrency", "is for inference"),
    ({"params": "7", "mode": "train", "max_nodes": 0}, "--max-nodes", "must be 1..2000"),
    ({"params": "7", "mode": "train", "mfu": 1.5}, "--mfu", "must be a fraction of the peak in (0, 1]"),
    ({"params": "7", "mode": "train", "tokens": "lots"}, "--tokens", "positive token count"),
])
def test_bad_workloads_name_the_option(kwargs: dict[str, Any], option: str, words: str) -> None:
    with pytest.raises(SizingError) as err:
        make_workload(**kwargs)
    assert err.value.option == option and words in str(err.value)
    assert str(err.value).startswith(option + ": ")


def test_another_model_by_its_shape() -> None:
    w = make_workload("30", "inference", layers=60, hidden=6656, concurrency=1)
    assert (w.model.heads, w.model.kv_heads, w.model.vocab) == (52, 52, 128_256)  # head_dim 128, MHA
    assert estimate_memory(w).kv_cache == 2 * 60 * 52 * 128 * 4096 * 2
    assert w.model.params == 30e9 and w.model.largest_module_params == 128_256 * 6656


# ------------------------------------------------------------------ LoRA, QLoRA


def test_lora_adapters_on_every_linear_layer() -> None:
    """Llama 3.1 8B, rank 16 on q, k, v, o, gate, up, down: 41,943,040 trainable parameters (what
    Hugging Face PEFT reports for this model and target set)."""
    assert MODELS["llama-3.1-8b"].lora_params(16) == 41_943_040
    w = make_workload(model="llama-3.1-8b", mode="lora")
    memory = estimate_memory(w)
    p = 8_030_261_248
    assert memory.weights == 2 * p  # the frozen base in bf16, no gradients or optimizer states for it
    assert memory.adapters == 2 * 41_943_040
    assert memory.gradients == 2 * 41_943_040 and memory.optimizer == 12 * 41_943_040  # 16 B in all
    assert memory.buffers == memory.kv_cache == 0


def test_qlora_keeps_the_base_in_4_bits_and_the_embeddings_in_16() -> None:
    """QLoRA section 3: NF4 plus double-quantised constants, 4.127 bits per parameter."""
    w = make_workload(model="llama-3.1-8b", mode="qlora", lora_rank=64)
    memory = estimate_memory(w)
    p, embeddings = 8_030_261_248, 2 * 128_256 * 4096  # untied input embedding and output head
    assert memory.weights == pytest.approx((p - embeddings) * 4.127 / 8 + 2 * embeddings)
    assert memory.adapters == 2 * 4 * 41_943_040  # rank 64
    assert w.flops_per_token == 4 and w.max_nodes == 1


def test_adapter_training_counts_four_flops_per_parameter_and_token() -> None:
    lora = make_workload(model="llama-3.1-8b", mode="lora", tokens="1b")
    full = make_workload(model="llama-3.1-8b", mode="finetune", tokens="1b")
    assert lora.flops == pytest.approx(4 * 8_030_261_248 * 1e9)
    assert full.flops == pytest.approx(6 * 8_030_261_248 * 1e9)


def test_qlora_fits_a_70b_model_on_one_large_gpu_where_lora_needs_a_node() -> None:
    qlora = recommend(make_workload(model="llama-3.1-70b", mode="qlora"))
    assert any(f.gpus == 1 for f in qlora)  # one 80 GB H100 (QLoRA: 65B on a single 48 GB GPU)
    lora = recommend(make_workload(model="llama-3.1-70b", mode="lora", max_nodes=1))
    assert lora and all(f.gpus >= 4 for f in lora)


@pytest.mark.parametrize(("kwargs", "option", "words"), [
    ({"params": "7", "mode": "train", "lora_rank": 8}, "--lora-rank", "is for --mode lora or qlora"),
    ({"params": "7", "mode": "lora", "lora_rank": 0}, "--lora-rank", "must be 1..4096"),
    ({"params": "7", "mode": "qlora", "precision": "fp32"}, "--precision", "computes in bf16 or fp16"),
])
def test_adapter_options_are_checked(kwargs: dict[str, Any], option: str, words: str) -> None:
    with pytest.raises(SizingError) as raised:
        make_workload(**kwargs)
    assert raised.value.option == option and words in str(raised.value)
