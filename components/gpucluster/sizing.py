"""Workload sizing: from a model and what is done with it to the GPU instances that fit it.

It owns the GPU memory estimate of a transformer workload (training, full fine-tuning or
inference) and the search over the catalog for the instance types and node counts that hold
it, ranked by on-demand cost per hour, plus the node-group snippet `gpucluster recommend`
prints. The formulas, with their sources:

- Training and full fine-tuning, mixed-precision Adam (ZeRO paper, Rajbhandari et al. 2020,
  section 3.1; EleutherAI "Transformer Math 101"): 2 B bf16/fp16 weights + 2 B gradients +
  12 B fp32 master weights, momentum and variance = 16 B per parameter (fp32: 4 + 4 + 8 = 16 B).
  These model states are sharded evenly over every GPU of every node (ZeRO-3 / FSDP).
- Activations, per GPU and micro-batch (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eq. 1 and section 4): with full activation
  checkpointing each layer keeps its 16-bit input, 2·s·b·h bytes, and one layer at a time is
  recomputed, 34·s·b·h bytes; the 5·a·s²·b attention-score term is dropped because
  FlashAttention never materialises the scores. So s·b·h·(2·L + 34) bytes (doubled in fp32).
- ZeRO-3 / FSDP gathers one layer's full weights and gradients at a time: 2 · (P / L) · w bytes.
- Inference: weights at the precision's bytes per parameter, + 20 % for activations and
  framework buffers ("Transformer Math 101": total ≈ 1.2 x model memory), + the KV cache
  2 · L · kv_heads · head_dim · s · b · 2 bytes (16-bit cache; fp32 models: 4 bytes), all
  sharded over the GPUs by tensor parallelism.
- Only 90 % of a GPU's memory is counted as usable (CUDA context, allocator fragmentation).
- More than one node needs EFA: a type is multi-node capable when it has EFA and more than
  one network card (single-card EFA sizes lack the bandwidth for collectives at scale).

It is pure: no Pulumi, no AWS calls. It must not price anything itself: rates come from
gpucluster.pricing, instance facts from gpucluster.catalog.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gpucluster import catalog
from gpucluster.pricing import on_demand_rate, typical_spot_rate

GIB = 1024**3
USABLE_FRACTION = 0.9
INFERENCE_OVERHEAD = 0.2  # "Transformer Math 101": inference memory ≈ 1.2 x weights
DEFAULT_SEQ_LEN = 4096
DEFAULT_MAX_NODES = {"train": 64, "finetune": 64, "inference": 1}

Mode = Literal["train", "finetune", "inference"]
MODES: tuple[Mode, ...] = ("train", "finetune", "inference")
TRAINING_PRECISIONS = ("bf16", "fp16", "fp32")
INFERENCE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}

# Number formats each GPU computes in (NVIDIA architecture whitepapers: BF16 arrived with
# Ampere, FP8 tensor cores with Ada Lovelace and Hopper); int8/int4 weight-only quantisation
# runs anywhere.
GPU_PRECISIONS: dict[str, frozenset[str]] = {
    "T4": frozenset({"fp32", "fp16", "int8", "int4"}),
    "A10G": frozenset({"fp32", "fp16", "bf16", "int8", "int4"}),
    "A100": frozenset({"fp32", "fp16", "bf16", "int8", "int4"}),
    "L4": frozenset({"fp32", "fp16", "bf16", "fp8", "int8", "int4"}),
    "L40S": frozenset({"fp32", "fp16", "bf16", "fp8", "int8", "int4"}),
    "H100": frozenset({"fp32", "fp16", "bf16", "fp8", "int8", "int4"}),
    "H200": frozenset({"fp32", "fp16", "bf16", "fp8", "int8", "int4"}),
    "B200": frozenset({"fp32", "fp16", "bf16", "fp8", "int8", "int4"}),
}


class SizingError(ValueError):
    """An invalid workload; `option` names the command-line option at fault."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"{option}: {message}")


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    source: str

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# Parameter count (billions) -> the model whose shape we assume (each model card's config.json).
KNOWN_SHAPES: dict[float, ModelShape] = {
    7: ModelShape(32, 4096, 32, 32, "Llama-2-7B (meta-llama/Llama-2-7b-hf config.json)"),
    8: ModelShape(32, 4096, 32, 8, "Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json)"),
    13: ModelShape(40, 5120, 40, 40, "Llama-2-13B (meta-llama/Llama-2-13b-hf config.json)"),
    70: ModelShape(80, 8192, 64, 8, "Llama-2-70B, GQA 8 KV heads (meta-llama/Llama-2-70b-hf config.json)"),
    405: ModelShape(126, 16384, 128, 8,
                    "Llama-3.1-405B, GQA 8 KV heads (meta-llama/Llama-3.1-405B config.json)"),
}


@dataclass(frozen=True)
class Workload:
    """What to fit: a model of `params_b` billion parameters and what is done with it."""

    params_b: float
    mode: Mode
    precision: str
    seq_len: int
    batch: int
    """Training: micro-batch per GPU; inference: sequences served at once (KV cache)."""
    max_nodes: int
    shape: ModelShape

    @property
    def params(self) -> float:
        return self.params_b * 1e9

    @property
    def training(self) -> bool:
        return self.mode != "inference"


def parse_params(text: str) -> float:
    """'7', '7b', '70B', '1.5t', '350m' -> billions of parameters."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mMbBtT]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise SizingError("--params", f"must be a positive parameter count like 7, 70b or 1.5t, got {text!r}")
    scale = {"m": 1e-3, "b": 1.0, "": 1.0, "t": 1e3}[match.group(2).lower()]
    return float(match.group(1)) * scale


def _positive(option: str, value: int | None, hi: int) -> None:
    if value is not None and not 1 <= value <= hi:
        raise SizingError(option, f"must be 1..{hi}, got {value}")


def make_workload(params: str, mode: str, precision: str = "bf16", seq_len: int | None = None,
                  batch: int = 1, max_nodes: int | None = None, layers: int | None = None,
                  hidden: int | None = None, heads: int | None = None,
                  kv_heads: int | None = None) -> Workload:
    """Validate command-line values into a Workload; SizingError names the option at fault."""
    params_b = parse_params(params)
    if mode not in MODES:
        raise SizingError("--mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    allowed = TRAINING_PRECISIONS if mode != "inference" else tuple(INFERENCE_BYTES)
    if precision not in allowed:
        raise SizingError("--precision", f"{mode} takes {', '.join(allowed)}, got {precision!r}")
    for option, value, hi in (("--seq-len", seq_len, 1_048_576), ("--batch", batch, 4096),
                              ("--max-nodes", max_nodes, 2000), ("--layers", layers, 1000),
                              ("--hidden", hidden, 131_072), ("--heads", heads, 1024),
                              ("--kv-heads", kv_heads, 1024)):
        _positive(option, value, hi)
    shape = _shape(params_b, layers, hidden, heads, kv_heads)
    return Workload(params_b, mode, precision, seq_len or DEFAULT_SEQ_LEN, batch,  # type: ignore[arg-type]
                    max_nodes or DEFAULT_MAX_NODES[mode], shape)


def _shape(params_b: float, layers: int | None, hidden: int | None, heads: int | None,
           kv_heads: int | None) -> ModelShape:
    if layers is None and hidden is None:
        if heads is not None or kv_heads is not None:
            raise SizingError("--heads", "give --layers and --hidden with --heads/--kv-heads")
        known = KNOWN_SHAPES.get(params_b)
        if known is None:
            listed = ", ".join(f"{k:g}" for k in KNOWN_SHAPES)
            raise SizingError("--layers", f"no known shape for a {params_b:g}B model (known: {listed} "
                              "billion); give --layers and --hidden (and --heads/--kv-heads for GQA)")
        return known
    if layers is None or hidden is None:
        raise SizingError("--layers" if layers is None else "--hidden", "give both --layers and --hidden")
    heads = heads or max(1, hidden // 128)  # head_dim 128, as in Llama, Mistral and GPT-NeoX
    kv_heads = kv_heads or heads
    if hidden % heads:
        raise SizingError("--heads", f"must divide --hidden ({hidden}), got {heads}")
    if kv_heads > heads or heads % kv_heads:
        raise SizingError("--kv-heads", f"must divide --heads ({heads}), got {kv_heads}")
    return ModelShape(layers, hidden, heads, kv_heads, "given on the command line")


# ----------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a workload needs: a part sharded over all GPUs and a part every GPU holds."""

    weights: float
    gradients: float
    optimizer: float
    overhead: float
    """Inference: 20 % of the weights for activations and buffers."""
    kv_cache: float
    activations: float
    """Per GPU (training)."""
    gather_buffers: float
    """Per GPU (training): one layer's gathered weights and gradients."""

    @property
    def sharded(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.overhead + self.kv_cache

    @property
    def per_gpu(self) -> float:
        return self.activations + self.gather_buffers

    def per_gpu_need(self, gpus: int) -> float:
        """Bytes on each GPU when the workload is spread over `gpus` GPUs."""
        return self.sharded / gpus + self.per_gpu


def estimate_memory(w: Workload) -> MemoryEstimate:
    """The memory of `w` by the formulas in the module docstring."""
    p, s = w.params, w.shape
    if w.training:
        word = 4 if w.precision == "fp32" else 2
        optimizer = 8 * p if w.precision == "fp32" else 12 * p
        activations = w.seq_len * w.batch * s.hidden * (2 * s.layers + 34) * word / 2
        return MemoryEstimate(weights=word * p, gradients=word * p, optimizer=optimizer, overhead=0.0,
                              kv_cache=0.0, activations=activations,
                              gather_buffers=2 * (p / s.layers) * word)
    weights = INFERENCE_BYTES[w.precision] * p
    kv_word = 4 if w.precision == "fp32" else 2
    kv = 2 * s.layers * s.kv_heads * s.head_dim * w.seq_len * w.batch * kv_word
    return MemoryEstimate(weights=weights, gradients=0.0, optimizer=0.0,
                          overhead=INFERENCE_OVERHEAD * weights, kv_cache=kv, activations=0.0,
                          gather_buffers=0.0)


# ------------------------------------------------------------------------- fits


def multi_node_capable(t: catalog.InstanceType) -> bool:
    """EFA and more than one network card: what multi-node collectives need."""
    return t.supports_efa and t.network_cards > 1


def usable_gib_per_gpu(t: catalog.InstanceType) -> float:
    return t.gpu_memory_mib * USABLE_FRACTION / 1024


@dataclass(frozen=True)
class Fit:
    """An instance type and node count that hold the workload, with its price."""

    instance_type: str
    gpu_model: str
    nodes: int
    gpus: int
    need_gib_per_gpu: float
    usable_gib_per_gpu: float
    usd_per_hour: float
    """On-demand, all nodes."""
    spot_usd_per_hour: float
    """At the family's typical spot discount, all nodes."""
    efa: bool


def recommend(w: Workload, region: str = "us-east-1") -> list[Fit]:
    """Every catalog type that fits `w` on its fewest nodes (<= max_nodes), cheapest first.

    Raises PricingError when the region has no prices.
    """
    memory = estimate_memory(w)
    fits = []
    for name in catalog.names():
        t = catalog.get(name)
        assert t is not None
        if t.capacity_block_only or not catalog.is_offered(name, region):
            continue
        if w.precision not in GPU_PRECISIONS.get(t.gpu_model, frozenset()):
            continue
        usable = usable_gib_per_gpu(t)
        limit = w.max_nodes if multi_node_capable(t) else 1
        for nodes in range(1, limit + 1):
            need = memory.per_gpu_need(nodes * t.gpus) / GIB
            if need <= usable:
                fits.append(Fit(t.name, t.gpu_model, nodes, nodes * t.gpus, need, usable,
                                nodes * on_demand_rate(t, region).usd_per_hour,
                                nodes * typical_spot_rate(t, region).usd_per_hour, nodes > 1))
                break
            if memory.per_gpu / GIB > usable:
                break  # the unsharded part alone does not fit: more nodes cannot help
    return sorted(fits, key=lambda f: (f.usd_per_hour, f.nodes, f.instance_type))


def node_group_snippet(fit: Fit, w: Workload) -> str:
    """A `gpucluster:node_groups` entry for `fit`, valid under gpucluster.spec."""
    family = catalog.family_of(fit.instance_type)
    name = f"{w.mode}-{family}"
    if w.training and fit.nodes > 1:
        capacity = "spot_percent: 0          # one interrupted node stops a multi-node job"
    elif w.training:
        capacity = "spot_percent: 100        # checkpoint through spot.interruption_command"
    else:
        capacity = "spot_percent: 0          # serving: no interruptions"
    efa = "efa: on\n    placement_group: true" if fit.nodes > 1 else "efa: off"
    return (
        f"# {fit.nodes} x {fit.instance_type} ({fit.gpus} x {fit.gpu_model}) for {w.params_b:g}B {w.mode} "
        f"({w.precision}): ~{fit.need_gib_per_gpu:.1f} of {fit.usable_gib_per_gpu:.1f} usable GiB per GPU\n"
        "gpucluster:node_groups:\n"
        f"  - name: {name}\n"
        f"    instance_types: [{fit.instance_type}]\n"
        "    min_nodes: 0\n"
        f"    desired_nodes: {fit.nodes}\n"
        f"    max_nodes: {fit.nodes}\n"
        "    capacity:\n"
        f"      {capacity}\n"
        f"    {efa}\n"
    )

