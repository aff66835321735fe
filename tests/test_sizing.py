"""`recommend`: memory estimates worked out in each test, fits cheapest first, valid snippets."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpucluster import catalog
from gpucluster.sizing import (
    GIB,
    Fit,
    SizingError,
    Workload,
    estimate_memory,
    make_workload,
    multi_node_capable,
    node_group_snippet,
    parse_params,
    recommend,
)
from gpucluster.spec import parse_stack_config


def usable(instance_type: str) -> float:
    """90 % of one GPU's memory, GiB."""
    t = catalog.get(instance_type)
    assert t is not None
    return t.gpu_memory_mib / 1024 * 0.9


def assert_ranked_and_minimal(fits: list[Fit], need_gib: Any) -> None:
    """Cheapest first; each fit holds the workload, on as few nodes as it can."""
    assert fits, "something fits"
    assert [f.usd_per_hour for f in fits] == sorted(f.usd_per_hour for f in fits)
    for f in fits:
        t = catalog.get(f.instance_type)
        assert t is not None
        assert f.need_gib_per_gpu == pytest.approx(need_gib(f.gpus))
        assert need_gib(f.gpus) <= usable(f.instance_type)
        if f.nodes > 1:
            assert need_gib(f.gpus - t.gpus) > usable(f.instance_type), f"{f} is not minimal"
            assert t.max_efa_interfaces > 0 and t.network_cards > 1, f"{f} is multi-node without EFA"
        assert f.usd_per_hour == pytest.approx(f.nodes * t.on_demand_price("us-east-1"))


def test_7b_inference() -> None:
    w = make_workload("7", "inference")                          # bf16, 4096 tokens, batch 1
    weights = 7e9 * 2
    kv = 2 * 32 * 32 * 128 * 4096 * 1 * 2                       # Llama-2-7B: MHA, head_dim 128 = 2 GiB
    total = weights * 1.2 + kv
    m = estimate_memory(w)
    assert (m.weights, m.kv_cache, m.sharded) == (pytest.approx(weights), kv, pytest.approx(total))
    assert total / GIB == pytest.approx(17.646, abs=1e-3)
    fits = recommend(w)
    assert_ranked_and_minimal(fits, lambda gpus: total / gpus / GIB)
    assert (fits[0].instance_type, fits[0].nodes) == ("g6.xlarge", 1)   # 1 x L4, $0.8048/h
    names = {f.instance_type for f in fits}
    assert "g4dn.xlarge" not in names                               # T4: no bf16, and 14.4 GiB usable
    assert all(f.nodes == 1 for f in fits)                          # inference defaults to one node


def test_7b_int8_inference_fits_a_t4() -> None:
    total = 7e9 * 1 * 1.2 + 2 * 32 * 32 * 128 * 4096 * 2          # 9.82 GiB < 14.4 usable on a T4
    fits = recommend(make_workload("7b", "inference", precision="int8"))
    assert fits[0].instance_type == "g4dn.xlarge"
    assert fits[0].need_gib_per_gpu == pytest.approx(total / GIB)


def test_70b_inference_uses_gqa_kv_cache() -> None:
    m = estimate_memory(make_workload("70", "inference", seq_len=8192, batch=4))
    assert m.kv_cache == 2 * 80 * 8 * 128 * 8192 * 4 * 2           # 8 KV heads, not 64


def test_7b_full_finetune() -> None:
    w = make_workload("7", "finetune")
    states = 16 * 7e9                                               # 2 + 2 + 12 B per parameter
    activations = 4096 * 1 * 4096 * (2 * 32 + 34)                 # s*b*h*(2L + 34), 16-bit
    gathered = 2 * (7e9 / 32) * 2                                   # one layer's weights + grads
    m = estimate_memory(w)
    assert m.sharded == pytest.approx(states)
    assert (m.weights, m.gradients, m.optimizer) == (pytest.approx(14e9), pytest.approx(14e9),
                                                     pytest.approx(84e9))
    assert m.activations == activations and m.gather_buffers == pytest.approx(gathered)
    fits = recommend(w)
    assert_ranked_and_minimal(fits, lambda gpus: (states / gpus + activations + gathered) / GIB)
    assert (fits[0].instance_type, fits[0].nodes, fits[0].gpus) == ("g6e.12xlarge", 1, 4)
    assert fits[0].need_gib_per_gpu == pytest.approx((28e9 + activations + gathered) / GIB)  # 28.4 GiB
    assert "g5.12xlarge" not in {f.instance_type for f in fits}   # 4 x 20.1 GiB too small, no 2nd node


def test_70b_training() -> None:
    w = make_workload("70", "train")
    states = 16 * 70e9
    per_gpu = 4096 * 8192 * (2 * 80 + 34) + 2 * (70e9 / 80) * 2   # activations + gathered layer
    fits = recommend(w)
    assert_ranked_and_minimal(fits, lambda gpus: (states / gpus + per_gpu) / GIB)
    best = fits[0]
    # p4de: 16 GPUs need 74.5 GiB > 72.0 usable; 24 GPUs need 52.8 -> 3 nodes at $27.45
    assert (best.instance_type, best.nodes) == ("p4de.24xlarge", 3)
    assert best.usd_per_hour == pytest.approx(3 * 27.45)
    assert best.efa
    assert not any(f.instance_type.startswith(("g5.", "g6.")) for f in fits)  # single-card EFA only


def test_405b_training() -> None:
    w = make_workload("405", "train")
    states = 16 * 405e9
    per_gpu = 4096 * 16384 * (2 * 126 + 34) + 2 * (405e9 / 126) * 2
    fits = recommend(w)
    assert_ranked_and_minimal(fits, lambda gpus: (states / gpus + per_gpu) / GIB)
    # p5e (H200): 56 GPUs need 137.6 GiB > 126.9; 64 need 124.1 -> 8 nodes at $60
    assert (fits[0].instance_type, fits[0].nodes, fits[0].usd_per_hour) == ("p5e.48xlarge", 8, 480.0)
    assert {f.instance_type for f in fits} == {"p5e.48xlarge", "p4de.24xlarge", "p5en.48xlarge",
                                               "p6-b200.48xlarge", "p5.48xlarge"}
    assert recommend(make_workload("405", "train", max_nodes=4)) == []  # nothing fits 4 nodes


def test_fp32_training_doubles_activations() -> None:
    bf16, fp32 = (estimate_memory(make_workload("7", "train", precision=p)) for p in ("bf16", "fp32"))
    assert fp32.activations == 2 * bf16.activations
    assert fp32.sharded == bf16.sharded == pytest.approx(16 * 7e9)  # 4 + 4 + 8 B vs 2 + 2 + 12 B


def test_multi_node_capable_needs_efa_on_several_cards() -> None:
    capable = {n for n in catalog.names() if multi_node_capable(catalog.get(n))}  # type: ignore[arg-type]
    assert {"p5.48xlarge", "p4d.24xlarge", "g6e.24xlarge", "g6e.48xlarge"} <= capable
    assert not capable & {"p5.4xlarge", "g6e.12xlarge", "g5.48xlarge", "g4dn.metal", "g5.xlarge"}


@pytest.mark.parametrize(("text", "billions"), [("7", 7.0), ("70b", 70.0), ("405B", 405.0),
                                                 ("1.5t", 1500.0), ("350m", 0.35)])
def test_parse_params(text: str, billions: float) -> None:
    assert parse_params(text) == pytest.approx(billions)


@pytest.mark.parametrize(("kwargs", "option", "words"), [
    ({"params": "seven", "mode": "train"}, "--params", "positive parameter count"),
    ({"params": "0", "mode": "train"}, "--params", "positive parameter count"),
    ({"params": "7", "mode": "fly"}, "--mode", "train, finetune, inference"),
    ({"params": "7", "mode": "train", "precision": "int4"}, "--precision", "bf16, fp16, fp32"),
    ({"params": "30", "mode": "train"}, "--layers", "no known shape for a 30B model"),
    ({"params": "30", "mode": "train", "layers": 60}, "--hidden", "give both"),
    ({"params": "30", "mode": "train", "layers": 60, "hidden": 6656, "heads": 52, "kv_heads": 5},
     "--kv-heads", "must divide --heads (52)"),
    ({"params": "30", "mode": "train", "layers": 60, "hidden": 6656, "heads": 50}, "--heads",
     "must divide --hidden"),
    ({"params": "7", "mode": "train", "batch": 0}, "--batch", "must be 1..4096"),
    ({"params": "7", "mode": "train", "max_nodes": 0}, "--max-nodes", "must be 1..2000"),
])
def test_bad_workloads_name_the_option(kwargs: dict[str, Any], option: str, words: str) -> None:
    with pytest.raises(SizingError) as err:
        make_workload(**kwargs)
    assert err.value.option == option and words in str(err.value)
    assert str(err.value).startswith(option + ": ")


def test_unknown_model_with_a_given_shape() -> None:
    w = make_workload("30", "inference", layers=60, hidden=6656)
    assert (w.shape.heads, w.shape.kv_heads) == (52, 52)           # head_dim 128, MHA
    assert estimate_memory(w).kv_cache == 2 * 60 * 52 * 128 * 4096 * 2


@pytest.mark.parametrize(("params", "mode"), [("7", "inference"), ("7", "finetune"), ("70", "train"),
                                              ("405", "train")])
def test_snippet_is_a_valid_node_group(base_config: dict[str, Any], params: str, mode: str) -> None:
    w: Workload = make_workload(params, mode)
    fit = recommend(w)[0]
    pasted = yaml.safe_load(node_group_snippet(fit, w))
    base_config.update(pasted)
    spec = parse_stack_config(base_config, stack="t")
    group = spec.node_groups[0]
    assert group.instance_types == [fit.instance_type]
    assert group.desired_nodes == group.max_nodes == fit.nodes
    assert group.efa_enabled == (fit.nodes > 1)
    assert spec.azs_of(group) == (["us-east-1a"] if fit.nodes > 1 else ["us-east-1a", "us-east-1b"])
    assert group.capacity.spot_percent == (0 if fit.nodes > 1 or not w.training else 100)
