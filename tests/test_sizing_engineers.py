"""`recommend` for engineers (issue 37, item 4): memory as each GPU holds it, the tight-fit caution,
efficiency by interconnect and scale, the cheaper-precision hint, concurrency shown with its effect, EFA
"not needed" on one node, and the decode model against two published throughput figures."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from gpucluster import catalog
from gpucluster.cli import app
from gpucluster.sizing import (
    GIB,
    at_concurrency,
    bus_gbs,
    cheaper_precision,
    decode,
    estimate_memory,
    make_workload,
    max_concurrency,
    recommend,
    training_efficiency,
    usable_gib_per_gpu,
)

runner = CliRunner()


def fit_of(fits: list, name: str):  # type: ignore[no-untyped-def]
    return next(f for f in fits if f.instance_type == name)


def test_each_gpu_of_a_one_gpu_replica_holds_the_whole_model() -> None:
    """Issue 37: `g5.12xlarge 4 x A10G 5.5/20 TP 1` for 8B inference; each A10G holds about 19 GiB."""
    w = make_workload(model="llama-3.1-8b", mode="inference")
    g5 = fit_of(recommend(w), "g5.12xlarge")
    assert (g5.tensor_parallel, g5.pipeline_parallel) == (1, 1)
    weights = 2 * 8_030_261_248 / GIB
    kv_two_sequences = 2 * (2 * 32 * 8 * 128 * 4096 * 2) / GIB     # 8 sequences over 4 replicas
    assert g5.held_gib == pytest.approx({"weights": weights, "overhead": 0.2 * weights,
                                         "kv_cache": kv_two_sequences})
    assert g5.need_gib_per_gpu == pytest.approx(18.95, abs=0.01)
    assert g5.need_gib_per_gpu == pytest.approx(sum(g5.held_gib.values()))


def test_training_states_are_sharded_over_every_gpu() -> None:
    w = make_workload(model="llama-3.1-70b", mode="finetune")
    p4d = fit_of(recommend(w), "p4d.24xlarge")
    assert p4d.need_gib_per_gpu == pytest.approx(estimate_memory(w).per_gpu_need(48) / GIB)
    assert p4d.held_gib["optimizer"] == pytest.approx(12 * w.model.params / 48 / GIB)


def test_a_fit_under_5_percent_headroom_is_marked() -> None:
    """Issue 37: `p4d.24xlarge 36.6/37` and `g6.xlarge 20.0/20` were listed without a caution."""
    p4d = fit_of(recommend(make_workload(model="llama-3.1-70b", mode="finetune")), "p4d.24xlarge")
    g6 = fit_of(recommend(make_workload(model="llama-3.1-8b", mode="lora")), "g6.xlarge")
    roomy = fit_of(recommend(make_workload(model="llama-3.1-8b", mode="lora")), "g6e.xlarge")
    assert p4d.tight and g6.tight and not roomy.tight
    assert p4d.headroom == pytest.approx(1 - p4d.need_gib_per_gpu / p4d.usable_gib_per_gpu)


def test_collectives_cross_the_slowest_link() -> None:
    """In one node the GPUs' own link; across nodes EFA where it is slower (g6e.24xlarge: 200 Gbps = 25 GB/s
    against PCIe Gen4's 32 GB/s one way), NVLink never (p5: 3,200 Gbps = 400 GB/s, NVLink 450)."""
    g6e, p5 = catalog.get("g6e.24xlarge"), catalog.get("p5.48xlarge")
    l40s, h100 = catalog.gpu_model("L40S"), catalog.gpu_model("H100")
    assert g6e and p5 and l40s and h100
    assert bus_gbs(g6e, l40s, 1) == (32, "PCIe Gen4 x16") and bus_gbs(g6e, l40s, 10) == (25, "EFA 200 Gbps")
    assert bus_gbs(p5, h100, 1) == (450, "NVLink 4") and bus_gbs(p5, h100, 4) == (400, "EFA 3200 Gbps")


def test_zero3_efficiency_is_compute_over_the_longer_of_compute_and_gathers() -> None:
    """70B full fine-tune on 10 x g6e.24xlarge: a step computes 6 x N x 4096 tokens per GPU at 40 % of
    362.05 TFLOPS and moves 3 x the bf16 weights x 39/40 at 25 GB/s."""
    w = make_workload(model="llama-3.1-70b", mode="finetune")
    t, gpu = catalog.get("g6e.24xlarge"), catalog.gpu_model("L40S")
    assert t and gpu
    compute = 6 * w.model.params * 4096 / (362.05e12 * 0.4)
    gathers = 3 * 2 * w.model.params * 39 / 40 / 25e9
    efficiency, link = training_efficiency(w, t, gpu, 10, 362.05)
    assert (efficiency, link) == (pytest.approx(compute / gathers), "EFA 200 Gbps")
    assert 0.7 < efficiency < 0.75


def test_interconnect_ranks_three_p4de_above_ten_pcie_g6e() -> None:
    """Issue 37: one 40 % for every interconnect ranked 10 x g6e.24xlarge above 3 x p4de."""
    fits = recommend(make_workload(model="llama-3.1-70b", mode="finetune"))
    order = [f.instance_type for f in fits]
    g6e, p4de = fit_of(fits, "g6e.24xlarge"), fit_of(fits, "p4de.24xlarge")
    assert (g6e.nodes, p4de.nodes) == (10, 3)
    assert order.index("p4de.24xlarge") < order.index("g6e.24xlarge")
    assert p4de.scaling_efficiency == 1.0 and g6e.scaling_efficiency < 0.75
    assert g6e.effective_tflops == pytest.approx(40 * 362.05 * 0.4 * g6e.scaling_efficiency)


def test_one_node_on_nvlink_loses_nothing() -> None:
    w = make_workload(model="llama-3.1-8b", mode="finetune", tokens="1b")
    assert fit_of(recommend(w), "p5.48xlarge").scaling_efficiency == 1.0


def test_fp8_is_hinted_where_it_serves_405b_for_less() -> None:
    """Issue 37: bf16 405B ranks p5en first at about $78/M tokens; fp8 on p5.48xlarge is about $49."""
    w = make_workload(model="llama-3.1-405b", mode="inference")
    fits = recommend(w)
    hint = cheaper_precision(w, fits)
    assert fits[0].instance_type == "p5en.48xlarge" and hint is not None
    precision, fit = hint
    assert (precision, fit.instance_type, fit.nodes) == ("fp8", "p5.48xlarge", 1)
    assert fit.usd_per_million_tokens is not None and fits[0].usd_per_million_tokens is not None
    assert fit.usd_per_million_tokens < 0.7 * fits[0].usd_per_million_tokens
    assert cheaper_precision(replace(w, precision="fp8"), recommend(replace(w, precision="fp8"))) is None
    result = runner.invoke(app, ["recommend", "--model", "llama-3.1-405b", "--mode", "inference"])
    text = " ".join(result.output.split())
    assert (f"cheaper at --precision fp8: 1 x p5.48xlarge at ${fit.usd_per_million_tokens:,.2f}/M tokens, "
            f"against ${fits[0].usd_per_million_tokens:,.2f} in bf16") in text


def test_concurrency_is_an_assumption_with_its_effect() -> None:
    w = make_workload(model="llama-3.1-8b", mode="inference")
    best = recommend(w)[0]
    most = max_concurrency(w, best)
    kv = estimate_memory(w).kv_cache / w.concurrency
    room = usable_gib_per_gpu(catalog.get(best.instance_type)) * GIB - 1.2 * 2 * w.model.params  # type: ignore[arg-type]
    assert most == int(room // kv) > w.concurrency
    there = at_concurrency(w, best, most, "us-east-1")
    assert there is not None and there.usd_per_million_tokens < best.usd_per_million_tokens / 5  # type: ignore[operator]
    result = runner.invoke(app, ["recommend", "--model", "llama-3.1-8b", "--mode", "inference"])
    text = " ".join(result.output.split())
    assert "assumed: 8 sequences decoded at once (--concurrency)" in text
    assert f"holds up to {most:,} at this sequence length" in text


def test_the_efa_column_says_not_needed_for_one_node() -> None:
    result = runner.invoke(app, ["recommend", "--model", "llama-3.1-70b", "--mode", "finetune"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line for line in result.output.splitlines() if line.startswith(("  1 ", "  2 "))}
    assert "not needed" in rows["p6-b200.48xlarge"] and " yes " in rows["p5.48xlarge"]
    assert "36.6/37!" in result.output                                      # p4d: under 5 % left
    assert max(len(line) for line in result.output.splitlines()) <= 100


# ------------------------------------------------------------------- against published figures


@pytest.mark.parametrize(("instance_type", "published", "error"), [
    ("p5.48xlarge", 21_806, -0.25), ("p5e.48xlarge", 31_712, -0.37)])
def test_decode_against_mlperf_llama2_70b_offline(instance_type: str, published: float, error: float) -> None:
    """MLPerf Inference v4.0, Llama 2 70B Offline, 8 x H100 and 8 x H200 (NVIDIA, FP8): the figures are from
    memory, unread here (ledger: mlperf-llama2-70b). The model, in fp8 at the most sequences of 2,048
    tokens (the benchmark's input and output limits, 1,024 each) the node holds, comes out 25 % (H100)
    and 37 % (H200) low: it reserves every sequence's whole context, where a paged KV cache holds what
    each has used; at 1,024 tokens it is 47 % and 26 % high. The errors are pinned to 2 points."""
    w = make_workload(model="llama-3.1-70b", mode="inference", precision="fp8", seq_len=2048)
    t = catalog.get(instance_type)
    gpu = catalog.gpu_model(t.gpu_model) if t else None
    assert t is not None and gpu is not None
    most = max_concurrency(w, fit_of(recommend(w, "us-west-2"), instance_type))  # p5e: Capacity Blocks
    rate, _, _ = decode(replace(w, concurrency=most), t, gpu, 1, gpu.peak_tflops("fp8") or 0.0)
    assert rate is not None
    assert rate / published - 1 == pytest.approx(error, abs=0.02)
