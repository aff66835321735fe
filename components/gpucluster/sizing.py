"""Workload sizing: from a model and what is done with it to the GPU instances that hold it, by job cost.

It owns the GPU memory estimate of a transformer workload (training, full fine-tuning or
inference), the search over the catalog for the instance types offered in a region (or zone)
and the fewest nodes of each that hold it, their ranking by what the job costs, and the
node-group snippet `gpucluster recommend` prints. The method, with its sources:

- Model states (training, full fine-tuning), as DeepSpeed's ZeRO-3 estimator computes them
  (microsoft/DeepSpeed, deepspeed/runtime/zero/stage3.py, `estimate_zero3_model_states_mem_needs`
  without offload, which `estimate_zero3_model_states_mem_needs_all_live` calls): per GPU
  `4 * largest_layer_params + 18 * total_params / total_gpus` bytes. The 18 B per parameter are
  the ZeRO paper's 16 (Rajbhandari et al. 2020, section 3.1: 2 B bf16 weights + 2 B gradients +
  12 B fp32 master weights, momentum and variance) plus 2 B the estimator adds; they are sharded
  over every GPU of every node. `largest_layer_params` is the most parameters one module owns
  (`model_to_params`: each module's own parameters, not its children's), which for the models
  here is the token embedding (vocab x hidden), held gathered with its gradient in 16 bits (4 B).
  fp32 training: 4 + 4 + 8 B plus the same 2 B, the largest module at 8 B.
- Activations, per GPU and micro-batch (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eq. 1 and section 4): with full activation
  checkpointing each layer keeps its 16-bit input, 2·s·b·h bytes, and one layer at a time is
  recomputed, 34·s·b·h bytes; the 5·a·s²·b attention-score term is dropped because
  FlashAttention never materialises the scores. So s·b·h·(2·L + 34) bytes (doubled in fp32).
- Logits, per GPU: s·b·vocab fp32 values (4 B), which the loss needs at once; about 2 GiB for a
  128k vocabulary at 4096 tokens.
- Inference: all weights at the precision's bytes per parameter (a mixture of experts keeps
  every expert in memory), + 20 % for activations and framework buffers ("Transformer Math
  101", EleutherAI: total ≈ 1.2 x model memory), + the KV cache of `concurrency` sequences of
  `seq_len` tokens, 2 · L · kv_heads · head_dim · s · 2 B each (fp32 models: 4 B), all sharded
  over the GPUs by tensor parallelism.
- LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): the base model
  frozen in 16 bits (2 B per parameter, no gradients, no optimizer states) plus trainable
  adapters of rank r on every linear layer, r·(inputs + outputs) parameters each, which carry
  16 B per parameter as full training does (bf16 weights and gradients, fp32 master weights and
  Adam's two moments). QLoRA (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized
  LLMs", section 3): the frozen base in 4-bit NormalFloat with double-quantised constants,
  (4 + 0.127) / 8 B per parameter, the embeddings and output head kept in 16 bits, the
  adapters as LoRA's. Activations and logits as training, with gradient checkpointing (both
  papers' setups); the frozen weights are sharded FSDP-style over the GPUs like the rest.
  Compute: 4·N·D FLOPs (forward 2N, backward 2N for activation gradients, none for frozen
  weights); the paged optimizer and dequantisation overheads are left out.
- Usable memory per GPU: the card's memory less 1 GiB for the CUDA context (PyTorch, cuBLAS
  workspaces, NCCL buffers), then 95 % of the rest (allocator fragmentation).
- More than one node needs EFA on several network cards (single-card EFA sizes lack the
  bandwidth for collectives at scale).
- Time and cost: 6 · N · D FLOPs to train on D tokens (Kaplan et al. 2020, "Scaling Laws for
  Neural Language Models", C ≈ 6ND), 2 · N per generated or scored token for inference, N the
  parameters active per token (a mixture of experts computes with its routed experts only),
  over the GPUs' dense peak at the compute format (catalog `gpu_models`, NVIDIA data sheets) at
  a stated model FLOPs utilisation (MFU, default 40 %). Training is ranked by the job's cost
  with `tokens`, else by price per effective TFLOP-hour (the same order).
- Inference is ranked by the cost of a generated token. Decoding reads every weight and the
  sequences' KV cache once a step, so a step takes those bytes over the GPUs' memory bandwidth
  (catalog `memory_bandwidth_gbs`, NVIDIA data sheets) at DECODE_MBU (60 %, Databricks' measured
  model bandwidth utilisation), or its FLOPs over the peak at MFU when that is longer; each
  replica spans the fewest GPUs that hold it (vLLM's advice) and the concurrency is spread over
  the replicas. Tokens per second x 3600 over the nodes' price per hour gives $ per token.
- Memory per GPU is what each GPU holds: training shards every model state over all GPUs
  (ZeRO-3); inference holds a replica's weights, runtime overhead and its own sequences' KV cache
  over the GPUs of that replica only (tensor parallel within a node, pipeline stages across
  nodes), so four one-GPU replicas of an 8B model each hold the whole model. A fit with under 5 %
  of the usable memory left is marked: a framework's own buffers or a longer prompt may not fit.
- Efficiency by interconnect and scale. ZeRO-3 gathers every parameter for the forward and the
  backward pass and reduce-scatters the gradients: 3 x the 16-bit weights per step (ZeRO paper,
  section 7.2.2: "3Ψ, 1.5x" data parallelism's 2Ψ); LoRA/QLoRA gather the frozen base twice and
  reduce only the adapters' gradients (2 x). A ring collective moves (g-1)/g of the data through
  each GPU at the bus bandwidth (NCCL's nccl-tests, doc/PERFORMANCE.md: busBw = algBw x (n-1)/n
  for all-gather and reduce-scatter). The bus bandwidth is the slowest link of the ring: the GPUs'
  own link inside one node (catalog `interconnect`: NVLink through NVSwitch on the p families, PCIe
  on the g families; ledger: gpu-interconnect), and across nodes the node's EFA bandwidth
  (DescribeInstanceTypes NetworkPerformance, catalog `network_gbps`) when that is lower. With
  prefetching the gathers overlap compute (DeepSpeed's `overlap_comm`, `stage3_prefetch_bucket_size`),
  so a step takes the longer of its compute and its communication: efficiency = compute /
  max(compute, communication), an upper bound (link rates are data-sheet rates; NCCL reaches
  less). Inference pays its tensor-parallel all-reduces (two per layer of a step's activations,
  2 (tp-1)/tp of them per GPU, Megatron-LM's layout, Shoeybi et al. 2019, section 3) on top of
  the step, since a layer waits for them; pipeline stages across nodes send one step's
  activations per stage boundary over EFA. Collective latency is left out.
- Checked against MLPerf Inference v4.0's Llama 2 70B Offline figures for 8 x H100 and 8 x H200
  (NVIDIA, FP8; figures from memory, ledger: mlperf-llama2-70b): at the most 2,048-token sequences a
  node holds the model is 25 % (H100) and 37 % (H200) low, at 1,024 tokens 47 % and 26 % high: it
  reserves each sequence's whole context (tests/test_sizing_engineers.py).

What it leaves out: tensor/pipeline-parallel training layouts, optimizer or parameter offload,
activation memory without checkpointing, parameter-efficient methods other than LoRA/QLoRA, the
KV cache's paging overhead and prefill activations at long context, prefill time (decode
dominates generation), tensor-parallel communication and per-step launch latency (MBU and MFU
stand for all of it).

It is pure: no Pulumi, no AWS calls. It must not price anything itself: rates come from
gpucluster.pricing, instance facts, GPU peaks and offerings from gpucluster.catalog.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from gpucluster import catalog
from gpucluster.pricing import PricingError, capacity_block_rate, on_demand_rate, typical_spot_rate

GIB = 1024**3
CUDA_CONTEXT_GIB = 1.0
FRAGMENTATION = 0.05
INFERENCE_OVERHEAD = 0.2  # "Transformer Math 101": inference memory ≈ 1.2 x weights
# Decode reaches about this share of the GPU's memory bandwidth (model bandwidth utilisation, MBU):
# Databricks, "LLM Inference Performance Engineering: Best Practices" (2023), measures MBU of about
# 60 % for a 7B model decoding on A100 and H100 at small batch sizes. A planning figure.
DECODE_MBU = 0.6
# DeepSpeed's estimator: 18 B per parameter of model states, 4 B per parameter of the largest module.
DEEPSPEED_STATE_BYTES = 18
DEEPSPEED_LARGEST_MODULE_BYTES = 4
LOGIT_BYTES = 4
DEFAULT_SEQ_LEN = 4096
DEFAULT_CONCURRENCY = 8
DEFAULT_MFU = 0.4
DEFAULT_MAX_NODES = {"train": 64, "finetune": 64, "lora": 8, "qlora": 1, "inference": 1}
# A fit with less than this share of its usable memory left is marked as tight.
HEADROOM_CAUTION = 0.05
# 16-bit weight volumes one training step moves through every GPU (module docstring): ZeRO-3 all-gathers
# the weights twice and reduce-scatters the gradients (ZeRO paper, section 7.2.2); LoRA/QLoRA gather the
# frozen base twice and reduce only the adapters' gradients.
STEP_VOLUME = {"train": 3, "finetune": 3, "lora": 2, "qlora": 2}
DEFAULT_LORA_RANK = 16
# LoRA and QLoRA (module docstring): the frozen base's bytes per parameter, and the trainable
# adapter's: bf16 weights and gradients, fp32 master weights and Adam's two moments (2+2+4+4+4).
ADAPTER_STATE_BYTES = 16
# QLoRA, section 3: NF4 weights (4 bits) with double-quantised constants, 0.127 bits per parameter
# ("reduces the memory footprint from 0.5 bits per parameter to 0.127 bits").
QLORA_BYTES = (4 + 0.127) / 8

Mode = Literal["train", "finetune", "lora", "qlora", "inference"]
MODES: tuple[Mode, ...] = ("train", "finetune", "lora", "qlora", "inference")
ADAPTER_MODES = ("lora", "qlora")
TRAINING_PRECISIONS = ("bf16", "fp16", "fp32")
INFERENCE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
WEIGHT_ONLY = ("int8", "int4")  # weight-only quantisation: the matmuls run in 16 bits


class SizingError(ValueError):
    """An invalid workload; `option` names the command-line option at fault."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"{option}: {message}")


# ----------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape, as its Hugging Face config.json gives it."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    source: str
    intermediate: int | None = None
    """MLP width (per expert); None for a shape given on the command line (then `given_params`)."""
    tied_embeddings: bool = False
    experts: int = 0
    """Experts per MoE layer (0: a dense model)."""
    experts_per_token: int = 0
    qkv_bias: bool = False
    head_dim_override: int | None = None
    given_params: float | None = None

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden // self.heads

    def _attention(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        bias = q + 2 * kv if self.qkv_bias else 0
        return self.hidden * q + 2 * self.hidden * kv + q * self.hidden + bias

    def _count(self, experts: int) -> float:
        assert self.intermediate is not None
        mlp = max(experts, 1) * 3 * self.hidden * self.intermediate  # gate, up, down projections
        router = self.hidden * self.experts if self.experts else 0
        per_layer = self._attention() + mlp + router + 2 * self.hidden  # + two RMSNorm weights
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return float(self.layers * per_layer + embeddings + self.hidden)  # + the final norm

    def lora_params(self, rank: int) -> float:
        """Trainable LoRA parameters at `rank` on every linear layer of every block (attention q, k,
        v, o; MLP gate, up, down, per expert): rank x (inputs + outputs) per adapted matrix (Hu et
        al. 2021, "LoRA", section 4.1: W + BA with B d x r, A r x k). All linear layers, as QLoRA
        (Dettmers et al. 2023, section 4) finds it needs to match full fine-tuning. A shape given
        on the command line has no MLP width: its MLP is taken as 4 x hidden (GPT's)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        mlp_width = self.intermediate or 4 * h
        attention = (h + q) + 2 * (h + kv) + (q + h)
        mlp = max(self.experts, 1) * (2 * (h + mlp_width) + (mlp_width + h))
        return float(rank * self.layers * (attention + mlp))

    @property
    def embedding_params(self) -> float:
        """The token embedding and the output head (one matrix when tied): kept in 16 bits by QLoRA."""
        return float(self.vocab * self.hidden * (1 if self.tied_embeddings else 2))

    @property
    def params(self) -> float:
        """Every parameter (all experts), shared ones once: what memory holds."""
        if self.intermediate is None:
            assert self.given_params is not None
            return self.given_params
        return self._count(self.experts)

    @property
    def active_params(self) -> float:
        """Parameters one token computes with (a mixture of experts: its routed experts only)."""
        if self.intermediate is None or not self.experts:
            return self.params
        return self._count(self.experts_per_token)

    @property
    def largest_module_params(self) -> float:
        """The most parameters one module owns (DeepSpeed's `model_to_params`)."""
        candidates = [self.vocab * self.hidden, self.hidden * self.heads * self.head_dim]
        if self.intermediate is not None:
            candidates.append(self.hidden * self.intermediate)  # one expert's (or the MLP's) projection
        return float(max(candidates))


def _hf(repo: str) -> str:
    return f"huggingface.co/{repo}/blob/main/config.json"


# Model name -> shape, every value from the model's config.json on Hugging Face. Mixtral's experts
# are one module each (w1, w2, w3 per expert), as transformers 4.x lays them out.
MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("llama-3.2-1b", 16, 2048, 32, 8, 128256, _hf("meta-llama/Llama-3.2-1B"), 8192,
               tied_embeddings=True, head_dim_override=64),
    ModelShape("llama-3.2-3b", 28, 3072, 24, 8, 128256, _hf("meta-llama/Llama-3.2-3B"), 8192,
               tied_embeddings=True),
    ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 128256, _hf("meta-llama/Llama-3.1-8B"), 14336),
    ModelShape("llama-3.1-70b", 80, 8192, 64, 8, 128256, _hf("meta-llama/Llama-3.1-70B"), 28672),
    ModelShape("llama-3.1-405b", 126, 16384, 128, 8, 128256, _hf("meta-llama/Llama-3.1-405B"), 53248),
    ModelShape("mistral-7b", 32, 4096, 32, 8, 32000, _hf("mistralai/Mistral-7B-v0.1"), 14336),
    ModelShape("mixtral-8x7b", 32, 4096, 32, 8, 32000, _hf("mistralai/Mixtral-8x7B-v0.1"), 14336,
               experts=8, experts_per_token=2),
    ModelShape("mixtral-8x22b", 56, 6144, 48, 8, 32000, _hf("mistralai/Mixtral-8x22B-v0.1"), 16384,
               experts=8, experts_per_token=2),
    ModelShape("qwen2.5-7b", 28, 3584, 28, 4, 152064, _hf("Qwen/Qwen2.5-7B"), 18944, qkv_bias=True),
    ModelShape("qwen2.5-72b", 80, 8192, 64, 8, 152064, _hf("Qwen/Qwen2.5-72B"), 29568, qkv_bias=True),
)}
# Also Llama 3.3 70B and Llama 3.1/3.2 instruct variants: the same shapes.
ALIASES = {"llama-3.3-70b": "llama-3.1-70b", "llama-3-8b": "llama-3.1-8b", "llama-3-70b": "llama-3.1-70b"}
# `--params N` alone: the model of that size whose shape is assumed.
BY_SIZE: dict[float, str] = {1: "llama-3.2-1b", 3: "llama-3.2-3b", 7: "mistral-7b", 8: "llama-3.1-8b",
                             47: "mixtral-8x7b", 70: "llama-3.1-70b", 72: "qwen2.5-72b",
                             141: "mixtral-8x22b", 405: "llama-3.1-405b"}
DEFAULT_VOCAB = 128256  # a command-line shape without --vocab: Llama 3's (the larger, safer figure)


def model_named(name: str) -> ModelShape:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        raise SizingError("--model", f"unknown model {name!r} (known: {', '.join(MODELS)})")
    return MODELS[key]


# --------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Workload:
    """What to fit: a model, what is done with it, and (optionally) how many tokens of it."""

    model: ModelShape
    mode: Mode
    precision: str
    seq_len: int
    batch: int
    """Training: micro-batch per GPU."""
    concurrency: int
    """Inference: sequences served at once (each with its KV cache)."""
    max_nodes: int
    tokens: float | None = None
    """Training: tokens trained on; inference: tokens generated or scored."""
    mfu: float = DEFAULT_MFU
    lora_rank: int = DEFAULT_LORA_RANK
    """LoRA / QLoRA: the adapters' rank."""

    @property
    def params(self) -> float:
        return self.model.params

    @property
    def params_b(self) -> float:
        return self.model.params / 1e9

    @property
    def training(self) -> bool:
        return self.mode != "inference"

    @property
    def flops_per_token(self) -> int:
        """Per active parameter: 6 to train (forward 2, backward 4), 4 with frozen weights (LoRA,
        QLoRA: the backward pass computes activation gradients, 2, but no weight gradients), 2 to
        generate."""
        return 2 if not self.training else 4 if self.mode in ADAPTER_MODES else 6

    @property
    def flops(self) -> float | None:
        """The job's FLOPs: flops_per_token x N x D (N active parameters, D tokens)."""
        if self.tokens is None:
            return None
        return self.flops_per_token * self.model.active_params * self.tokens

    def compute_format(self, gpu: catalog.GpuModel) -> str | None:
        """The number format the matmuls run in on `gpu`; None when the GPU cannot run this workload."""
        if self.precision in WEIGHT_ONLY:
            return "bf16" if gpu.peak_tflops("bf16") else "fp16"
        return self.precision if gpu.peak_tflops(self.precision) else None


_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_params(text: str) -> float:
    """'7', '7b', '70B', '1.5t', '350m' -> billions of parameters."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([mMbBtT]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise SizingError("--params", f"must be a positive parameter count like 7, 70b or 1.5t, got {text!r}")
    scale = {"m": 1e-3, "b": 1.0, "": 1.0, "t": 1e3}[match.group(2).lower()]
    return float(match.group(1)) * scale


# A token count without a unit below this is taken for a forgotten unit (`--tokens 2` meant 2t or 2b,
# not two tokens): no training or serving job worth sizing is under a million tokens.
UNITLESS_TOKENS_MIN = 1e6


def parse_tokens(text: str) -> float:
    """'2t', '500b', '1e9', '300m', '1000000' -> tokens; a bare number under a million is refused."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kKmMbBgGtT]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise SizingError("--tokens", f"must be a positive token count like 2t, 500b or 1e9, got {text!r}")
    value, unit = float(match.group(1)), match.group(2).lower()
    if not unit and value < UNITLESS_TOKENS_MIN:
        raise SizingError("--tokens", f"{text.strip()} has no unit: did you mean {match.group(1)}t "
                          f"({value:g} trillion) or {match.group(1)}b ({value:g} billion)? Give a unit "
                          "(k, m, b, t) or the full count (e.g. 2000000000)")
    return value * _SCALE[unit]


def _bounded(option: str, value: int | None, hi: int) -> None:
    if value is not None and not 1 <= value <= hi:
        raise SizingError(option, f"must be 1..{hi}, got {value}")


def make_workload(params: str | None = None, mode: str = "train", precision: str = "bf16",
                  seq_len: int | None = None, batch: int | None = None, max_nodes: int | None = None,
                  layers: int | None = None, hidden: int | None = None, heads: int | None = None,
                  kv_heads: int | None = None, *, model: str | None = None, concurrency: int | None = None,
                  vocab: int | None = None, tokens: str | None = None, mfu: float = DEFAULT_MFU,
                  lora_rank: int | None = None) -> Workload:
    """Validate command-line values into a Workload; SizingError names the option at fault."""
    if mode not in MODES:
        raise SizingError("--mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    allowed = TRAINING_PRECISIONS if mode != "inference" else tuple(INFERENCE_BYTES)
    if precision not in allowed:
        raise SizingError("--precision", f"{mode} takes {', '.join(allowed)}, got {precision!r}")
    for option, value, hi in (("--seq-len", seq_len, 1_048_576), ("--batch", batch, 4096),
                              ("--concurrency", concurrency, 65_536), ("--max-nodes", max_nodes, 2000),
                              ("--layers", layers, 1000), ("--hidden", hidden, 131_072),
                              ("--heads", heads, 1024), ("--kv-heads", kv_heads, 1024),
                              ("--vocab", vocab, 4_194_304)):
        _bounded(option, value, hi)
    if mode == "inference" and batch is not None:
        raise SizingError("--batch", "is the training micro-batch; inference takes --concurrency "
                          "(sequences served at once)")
    if mode != "inference" and concurrency is not None:
        raise SizingError("--concurrency", "is for inference; training takes --batch (micro-batch per GPU)")
    if not 0 < mfu <= 1:
        raise SizingError("--mfu", f"must be a fraction of the peak in (0, 1], e.g. 0.4, got {mfu:g}")
    if lora_rank is not None and mode not in ADAPTER_MODES:
        raise SizingError("--lora-rank", "is for --mode lora or qlora")
    _bounded("--lora-rank", lora_rank, 4096)
    if mode in ADAPTER_MODES and precision == "fp32":
        raise SizingError("--precision", f"{mode} computes in bf16 or fp16, got 'fp32'")
    shape = _shape(params, model, layers, hidden, heads, kv_heads, vocab)
    return Workload(shape, mode, precision, seq_len or DEFAULT_SEQ_LEN, batch or 1,
                    concurrency or DEFAULT_CONCURRENCY, max_nodes or DEFAULT_MAX_NODES[mode],
                    None if tokens is None else parse_tokens(tokens), mfu, lora_rank or DEFAULT_LORA_RANK)


def _shape(params: str | None, model: str | None, layers: int | None, hidden: int | None,
           heads: int | None, kv_heads: int | None, vocab: int | None) -> ModelShape:
    custom = any(v is not None for v in (layers, hidden, heads, kv_heads, vocab))
    if model is not None:
        if params is not None or custom:
            raise SizingError("--model", "give --model alone, or --params with --layers/--hidden for "
                              "another model")
        return model_named(model)
    if params is None:
        raise SizingError("--params", "give --model NAME or --params (model size, e.g. 7 or 70b)")
    params_b = parse_params(params)
    if not custom:
        known = BY_SIZE.get(params_b)
        if known is None:
            listed = ", ".join(f"{k:g}" for k in BY_SIZE)
            raise SizingError("--layers", f"no known shape for a {params_b:g}B model (known: {listed} "
                              "billion, or --model); give --layers and --hidden (and --heads/--kv-heads "
                              "for GQA, --vocab)")
        return MODELS[known]
    if layers is None or hidden is None:
        raise SizingError("--layers" if layers is None else "--hidden", "give both --layers and --hidden")
    heads = heads or max(1, hidden // 128)  # head_dim 128, as in Llama, Mistral and GPT-NeoX
    kv_heads = kv_heads or heads
    if hidden % heads:
        raise SizingError("--heads", f"must divide --hidden ({hidden}), got {heads}")
    if kv_heads > heads or heads % kv_heads:
        raise SizingError("--kv-heads", f"must divide --heads ({heads}), got {kv_heads}")
    return ModelShape(f"{params_b:g}B", layers, hidden, heads, kv_heads, vocab or DEFAULT_VOCAB,
                      "given on the command line", given_params=params_b * 1e9)


# ----------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a workload needs: a part sharded over all GPUs and a part every GPU holds."""

    weights: float
    gradients: float
    optimizer: float
    buffers: float
    """Training: the 2 B per parameter DeepSpeed's estimator counts beyond the ZeRO paper's 16."""
    overhead: float
    """Inference: 20 % of the weights for activations and buffers."""
    kv_cache: float
    largest_module: float
    """Per GPU (training): the largest module's gathered weights and gradients."""
    activations: float
    """Per GPU (training)."""
    logits: float
    """Per GPU (training): the fp32 logits the loss needs."""
    adapters: float = 0.0
    """LoRA / QLoRA: the trainable adapters' weights (their gradients and optimizer states are in
    `gradients` and `optimizer`)."""

    @property
    def sharded(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.buffers + self.overhead
                + self.kv_cache + self.adapters)

    @property
    def per_gpu(self) -> float:
        return self.largest_module + self.activations + self.logits

    def per_gpu_need(self, gpus: int) -> float:
        """Bytes on each GPU when the workload is spread over `gpus` GPUs."""
        return self.sharded / gpus + self.per_gpu

    def model_states_per_gpu(self, gpus: int) -> float:
        """What DeepSpeed's ZeRO-3 estimator reports per GPU: sharded states + the largest module."""
        states = self.weights + self.gradients + self.optimizer + self.buffers
        return states / gpus + self.largest_module


def estimate_memory(w: Workload) -> MemoryEstimate:
    """The memory of `w` by the method in the module docstring."""
    m, p = w.model, w.model.params
    if w.mode in ADAPTER_MODES:
        adapter = m.lora_params(w.lora_rank)
        if w.mode == "qlora":
            embeddings = min(m.embedding_params, p)
            base = QLORA_BYTES * (p - embeddings) + 2 * embeddings
        else:
            base = 2.0 * p
        activations: float = w.seq_len * w.batch * m.hidden * (2 * m.layers + 34)
        return MemoryEstimate(
            weights=base, gradients=2 * adapter, optimizer=(ADAPTER_STATE_BYTES - 4) * adapter,
            buffers=0.0, overhead=0.0, kv_cache=0.0, adapters=2 * adapter,
            largest_module=2.0 * m.largest_module_params, activations=activations,
            logits=float(w.seq_len * w.batch * m.vocab * LOGIT_BYTES))
    if w.training:
        word = 4 if w.precision == "fp32" else 2
        optimizer = 8 * p if w.precision == "fp32" else 12 * p
        activations = w.seq_len * w.batch * m.hidden * (2 * m.layers + 34) * word / 2
        return MemoryEstimate(
            weights=word * p, gradients=word * p, optimizer=optimizer,
            buffers=(DEEPSPEED_STATE_BYTES - 16) * p, overhead=0.0, kv_cache=0.0,
            largest_module=DEEPSPEED_LARGEST_MODULE_BYTES * word / 2 * m.largest_module_params,
            activations=activations, logits=float(w.seq_len * w.batch * m.vocab * LOGIT_BYTES))
    weights = INFERENCE_BYTES[w.precision] * p
    kv_word = 4 if w.precision == "fp32" else 2
    kv = 2 * m.layers * m.kv_heads * m.head_dim * w.seq_len * w.concurrency * kv_word
    return MemoryEstimate(weights=weights, gradients=0.0, optimizer=0.0, buffers=0.0,
                          overhead=INFERENCE_OVERHEAD * weights, kv_cache=float(kv),
                          largest_module=0.0, activations=0.0, logits=0.0)


# ------------------------------------------------------------------------- fits


def multi_node_capable(t: catalog.InstanceType) -> bool:
    """EFA and more than one network card: what multi-node collectives need."""
    return t.supports_efa and t.network_cards > 1


def usable_gib_per_gpu(t: catalog.InstanceType) -> float:
    """The card's memory less the CUDA context, less fragmentation (module docstring)."""
    return (t.gpu_memory_mib / 1024 - CUDA_CONTEXT_GIB) * (1 - FRAGMENTATION)


@dataclass(frozen=True)
class Fit:
    """An instance type and node count that hold the workload, with its price and speed."""

    instance_type: str
    gpu_model: str
    nodes: int
    gpus: int
    need_gib_per_gpu: float
    usable_gib_per_gpu: float
    usd_per_hour: float
    """All nodes: on-demand, or the Capacity Block rate for a type sold only as blocks."""
    price_basis: str
    spot_usd_per_hour: float | None
    """At the family's typical spot discount, all nodes; None without a spot market."""
    efa: bool
    compute_format: str
    peak_tflops_per_gpu: float
    effective_tflops: float
    """All GPUs at the workload's MFU."""
    hours: float | None
    """With tokens: how long the job runs."""
    job_usd: float | None
    tokens_per_second: float | None = None
    """Inference: generated tokens per second of all nodes at the workload's concurrency (decode)."""
    usd_per_million_tokens: float | None = None
    """Inference: what a million generated tokens cost on these nodes at that rate."""
    tensor_parallel: int | None = None
    """Inference: GPUs one model replica spans (the fewest that hold it and its sequences)."""
    pipeline_parallel: int | None = None
    """Inference: nodes one replica spans (pipeline stages; tensor parallel within each node)."""
    scaling_efficiency: float = 1.0
    """Share of a step's time spent computing, the rest waiting on collectives (module docstring)."""
    link: str = ""
    """The slowest link the collectives cross: the GPUs' own (NVLink, PCIe) or the nodes' EFA."""
    held_gib: dict[str, float] = field(default_factory=dict)
    """What each GPU holds, GiB by part (their sum is need_gib_per_gpu)."""

    @property
    def headroom(self) -> float:
        """The share of the usable memory per GPU left free."""
        return 1 - self.need_gib_per_gpu / self.usable_gib_per_gpu

    @property
    def tight(self) -> bool:
        return self.headroom < HEADROOM_CAUTION

    @property
    def tensor_per_node(self) -> int | None:
        """Inference: the tensor-parallel degree within one node."""
        if self.tensor_parallel is None:
            return None
        return self.tensor_parallel // (self.pipeline_parallel or 1)

    @property
    def usd_per_effective_tflop_hour(self) -> float:
        return self.usd_per_hour / self.effective_tflops

    @property
    def rank_key(self) -> tuple[float, int, str]:
        """Inference: cost per generated token; training: the job's cost (or $ per effective TFLOP-h)."""
        cost = (self.usd_per_million_tokens if self.usd_per_million_tokens is not None
                else self.job_usd if self.job_usd is not None else self.usd_per_effective_tflop_hour)
        return (cost, self.nodes, self.instance_type)


def _prices(t: catalog.InstanceType, region: str, nodes: int) -> tuple[float, str, float | None]:
    if t.capacity_block_only:
        return nodes * capacity_block_rate(t).usd_per_hour, "capacity block", None
    return (nodes * on_demand_rate(t, region).usd_per_hour, "on-demand",
            nodes * typical_spot_rate(t, region).usd_per_hour)


def priced(t: catalog.InstanceType, region: str) -> bool:
    """Whether `t` has a price in `region` (the catalog's or the project's price file)."""
    try:
        _prices(t, region, 1)
    except PricingError:
        return False
    return True


def bus_gbs(t: catalog.InstanceType, gpu: catalog.GpuModel, nodes: int) -> tuple[float, str]:
    """(GB/s, link) of a ring collective over `nodes` x `t`: the GPUs' own link inside one node,
    across nodes the lower of that and the node's EFA bandwidth (module docstring)."""
    if nodes > 1 and t.network_gbps / 8 < gpu.interconnect_gbs:
        return t.network_gbps / 8, f"EFA {t.network_gbps:g} Gbps"
    return gpu.interconnect_gbs, gpu.interconnect


def training_efficiency(w: Workload, t: catalog.InstanceType, gpu: catalog.GpuModel, nodes: int,
                        peak_tflops: float) -> tuple[float, str]:
    """(compute / max(compute, communication) of one step, the slowest link) for ZeRO-3 / FSDP."""
    gpus = nodes * t.gpus
    bandwidth, link = bus_gbs(t, gpu, nodes)
    if gpus == 1 or not peak_tflops:
        return 1.0, link
    compute = (w.flops_per_token * w.model.active_params * w.batch * w.seq_len
               / (peak_tflops * 1e12 * w.mfu))
    moved = STEP_VOLUME[w.mode] * estimate_memory(w).weights * (gpus - 1) / gpus
    communication = moved / (bandwidth * 1e9) if bandwidth else 0.0
    return compute / max(compute, communication), link


def held_per_gpu(w: Workload, memory: MemoryEstimate, gpus: int, tp: int | None = None,
                 replicas: int = 1) -> dict[str, float]:
    """GiB each GPU holds, by part: training shards every state over all `gpus`; inference holds a
    replica's weights, overhead and its own sequences' KV cache over the `tp` GPUs of the replica."""
    if w.training:
        sharded = {"weights": memory.weights, "adapters": memory.adapters, "gradients": memory.gradients,
                   "optimizer": memory.optimizer, "buffers": memory.buffers}
        parts = {k: v / gpus for k, v in sharded.items()}
        parts.update(largest_module=memory.largest_module, activations=memory.activations,
                     logits=memory.logits)
    else:
        span = tp or gpus
        sequences = -(-w.concurrency // min(replicas, w.concurrency))
        parts = {"weights": memory.weights / span, "overhead": memory.overhead / span,
                 "kv_cache": memory.kv_cache / w.concurrency * sequences / span}
    return {k: v / GIB for k, v in parts.items() if v}


def _fit(w: Workload, t: catalog.InstanceType, gpu: catalog.GpuModel, fmt: str, nodes: int,
         region: str) -> Fit:
    peak = gpu.peak_tflops(fmt) or 0.0
    usd, basis, spot = _prices(t, region, nodes)
    memory, gpus = estimate_memory(w), nodes * t.gpus
    if not w.training:
        rate, tp, efficiency = decode(w, t, gpu, nodes, peak)
        replicas = gpus // tp if tp else 1
        held = held_per_gpu(w, memory, gpus, tp, replicas)
        hours = None if w.tokens is None or rate is None else w.tokens / rate / 3600
        per_million = None if rate is None else usd / (rate * 3600) * 1e6
        stages = None if tp is None else max(1, tp // t.gpus)
        link = gpu.interconnect if stages in (None, 1) else f"EFA {t.network_gbps:g} Gbps"
        return Fit(t.name, t.gpu_model, nodes, gpus, sum(held.values()), usable_gib_per_gpu(t), usd, basis,
                   spot, nodes > 1, fmt, peak, gpus * peak * w.mfu, hours,
                   None if hours is None else hours * usd, rate, per_million, tp, stages,
                   efficiency, link, held)
    efficiency, link = training_efficiency(w, t, gpu, nodes, peak)
    effective = gpus * peak * w.mfu * efficiency
    flops = w.flops
    hours = None if flops is None else flops / (effective * 1e12) / 3600
    held = held_per_gpu(w, memory, gpus)
    return Fit(t.name, t.gpu_model, nodes, gpus, sum(held.values()), usable_gib_per_gpu(t), usd, basis, spot,
               nodes > 1, fmt, peak, effective, hours, None if hours is None else hours * usd,
               scaling_efficiency=efficiency, link=link, held_gib=held)


def tensor_parallel_degree(w: Workload, t: catalog.InstanceType, total_gpus: int) -> tuple[int, int]:
    """(GPUs a replica spans, replicas): the fewest GPUs, a power of two or all of them, that hold
    the weights and the KV cache of the sequences a replica serves; the other GPUs run replicas.

    Serving stacks shard a model only when it does not fit one GPU (vLLM docs, "Distributed
    inference and serving": "If your model fits in a single GPU, you probably don't need to use
    distributed inference"): a small model over eight GPUs spends each step on all-reduces.
    """
    memory = estimate_memory(w)
    weights = memory.weights + memory.overhead
    kv_per_sequence = memory.kv_cache / w.concurrency
    usable = usable_gib_per_gpu(t) * GIB
    sizes = sorted({*(2**i for i in range(total_gpus.bit_length()) if 2**i <= total_gpus), total_gpus})
    for tp in sizes:
        replicas = total_gpus // tp
        sequences = -(-w.concurrency // min(replicas, w.concurrency))
        if (weights + kv_per_sequence * sequences) / tp <= usable:
            return tp, replicas
    return total_gpus, 1


def decode_rate(w: Workload, t: catalog.InstanceType, gpu: catalog.GpuModel, nodes: int,
                peak_tflops: float) -> tuple[float | None, int | None]:
    """(generated tokens per second, GPUs a replica spans) of `nodes` x `t` serving `w` (`decode`)."""
    rate, tp, _ = decode(w, t, gpu, nodes, peak_tflops)
    return rate, tp


def decode(w: Workload, t: catalog.InstanceType, gpu: catalog.GpuModel, nodes: int,
           peak_tflops: float) -> tuple[float | None, int | None, float]:
    """(generated tokens per second, GPUs a replica spans, efficiency) of `nodes` x `t` serving `w`.

    Decoding is bound by memory bandwidth: every step a replica reads its weights (a mixture of
    experts: the experts its sequences route to, at most all) and its sequences' KV cache (at
    half the sequence length on average), and emits one token per sequence. The step takes
    bytes / (its GPUs' bandwidth x DECODE_MBU), or its FLOPs (2 per active parameter per token)
    over their peak x MFU when that is longer, plus its collectives: two all-reduces a layer of
    the step's activations within a node, one send of them per pipeline stage boundary across
    nodes (module docstring). The efficiency is the step without the collectives over the step
    with them. None without a bandwidth figure for the GPU.
    """
    bandwidth = gpu.bandwidth_gbs(t.gpu_memory_mib)
    if bandwidth is None:
        return None, None, 1.0
    total_gpus = nodes * t.gpus
    tp, replicas = tensor_parallel_degree(w, t, total_gpus)
    busy = min(replicas, w.concurrency)
    sequences = w.concurrency / busy
    m, memory = w.model, estimate_memory(w)
    weight_bytes = INFERENCE_BYTES[w.precision] * min(m.params, m.active_params * sequences)
    kv_bytes = memory.kv_cache / w.concurrency * sequences / 2
    memory_seconds = (weight_bytes + kv_bytes) / (tp * bandwidth * 1e9 * DECODE_MBU)
    compute_seconds = 2 * m.active_params * sequences / (tp * peak_tflops * 1e12 * w.mfu) \
        if peak_tflops else 0.0
    step = max(memory_seconds, compute_seconds)
    within, stages = min(tp, t.gpus), max(1, tp // t.gpus)
    activations = sequences * m.hidden * 2
    talk = 0.0
    if within > 1 and gpu.interconnect_gbs:
        talk += 2 * m.layers * 2 * (within - 1) / within * activations / (gpu.interconnect_gbs * 1e9)
    if stages > 1 and t.network_gbps:
        talk += (stages - 1) * activations / (t.network_gbps / 8 * 1e9)
    return busy * sequences / (step + talk), tp, step / (step + talk)


def max_concurrency(w: Workload, fit: Fit) -> int:
    """Inference: the most sequences of `w.seq_len` the fit's replicas hold (each replica's GPUs
    after its weights and overhead, over one sequence's KV cache)."""
    t, memory = catalog.get(fit.instance_type), estimate_memory(w)
    if t is None or fit.tensor_parallel is None:
        return w.concurrency
    room = usable_gib_per_gpu(t) * GIB * fit.tensor_parallel - memory.weights - memory.overhead
    per_replica = int(room // (memory.kv_cache / w.concurrency))
    return max(w.concurrency, fit.gpus // fit.tensor_parallel * per_replica)


def at_concurrency(w: Workload, fit: Fit, concurrency: int, region: str) -> Fit | None:
    """The same nodes serving `concurrency` sequences at once (None: the GPU has no figures)."""
    t = catalog.get(fit.instance_type)
    gpu = catalog.gpu_model(t.gpu_model) if t else None
    if t is None or gpu is None:
        return None
    return _fit(replace(w, concurrency=concurrency), t, gpu, fit.compute_format, fit.nodes, region)


def cheaper_precision(w: Workload, fits: list[Fit], region: str = "us-east-1",
                      zone: str | None = None) -> tuple[str, Fit] | None:
    """Inference in 16 or 32 bits: (fp8, its best fit) when serving in fp8 on a GPU that computes in
    it costs less per generated token than the best fit at `w.precision`; else None. Its weights
    are half the bytes (a quality trade the user decides)."""
    if w.training or w.precision not in ("bf16", "fp16", "fp32") or not fits:
        return None
    best = fits[0].usd_per_million_tokens
    lower = [f for f in recommend(replace(w, precision="fp8"), region, zone)
             if f.usd_per_million_tokens is not None]
    if best is None or not lower or lower[0].usd_per_million_tokens >= best:  # type: ignore[operator]
        return None
    return "fp8", lower[0]


def offered_types(region: str, zone: str | None = None) -> list[str]:
    """Catalog types offered in `region` (in `zone`, when given), in catalog order."""
    if zone is not None and (not zone.startswith(region) or len(zone) != len(region) + 1):
        raise SizingError("--zone", f"{zone!r} is not a zone of region {region!r} (--region)")
    return [n for n in catalog.names() if catalog.is_offered(n, region, zone)]


def unpriced_types(region: str, zone: str | None = None) -> list[str]:
    """Offered types with no price in `region`: `recommend` leaves them out (and says so once)."""
    return [n for n in offered_types(region, zone)
            if (t := catalog.get(n)) is not None and not priced(t, region)]


def recommend(w: Workload, region: str = "us-east-1", zone: str | None = None) -> list[Fit]:
    """Every offered, priced type that fits `w` on its fewest nodes (<= max_nodes), the cheapest job
    first. A type without a price in the region is left out (`unpriced_types` names them)."""
    memory = estimate_memory(w)
    fits = []
    for name in offered_types(region, zone):
        t = catalog.get(name)
        gpu = catalog.gpu_model(t.gpu_model) if t else None
        fmt = w.compute_format(gpu) if gpu else None
        if t is None or gpu is None or fmt is None or not priced(t, region):
            continue
        usable = usable_gib_per_gpu(t)
        limit = w.max_nodes if multi_node_capable(t) else 1
        for nodes in range(1, limit + 1):
            need = memory.per_gpu_need(nodes * t.gpus) / GIB
            if need <= usable:
                fits.append(_fit(w, t, gpu, fmt, nodes, region))
                break
            if memory.per_gpu / GIB > usable:
                break  # the unsharded part alone does not fit: more nodes cannot help
    return sorted(fits, key=lambda f: f.rank_key)


def orderable(fits: list[Fit]) -> Fit | None:
    """The best fit that can be ordered at once (on demand or spot), not only as a Capacity Block."""
    return next((f for f in fits if f.price_basis != "capacity block"), None)


def recommendation_snippet(fits: list[Fit], w: Workload, region: str = "us-east-1",
                           zone: str | None = None) -> str | None:
    """What to paste: the best fit's node group; when that is a Capacity Block type, how to buy the
    block and, beside it, the node group of the best type that can be ordered on demand today."""
    if not fits:
        return None
    text = node_group_snippet(fits[0], w, region, zone)
    other = orderable(fits)
    if fits[0].price_basis == "capacity block" and other is not None:
        text += ("#\n# or now, on demand (no block to buy): the best type that can be ordered at once\n"
                 + node_group_snippet(other, w, region, zone))
    return text


def node_group_snippet(fit: Fit, w: Workload, region: str = "us-east-1", zone: str | None = None) -> str:
    """A `gpucluster:node_groups` entry for `fit`, valid under gpucluster.spec.

    A type sold only as Capacity Blocks gets the command that buys one instead: the block's
    reservation id goes into the group, and `gpucluster capacity buy` prints that group.
    """
    summary = (f"# {fit.nodes} x {fit.instance_type} ({fit.gpus} x {fit.gpu_model}) for {w.model.name} "
               f"{w.mode} ({w.precision}): ~{fit.need_gib_per_gpu:.1f} of {fit.usable_gib_per_gpu:.1f} "
               "usable GiB per GPU\n")
    if fit.price_basis == "capacity block":
        return (summary + f"# {fit.instance_type} is sold only as Capacity Blocks for ML: buy one, then "
                "paste the node group `capacity buy` prints:\n"
                f"#   gpucluster capacity search --type {fit.instance_type} --count {fit.nodes} --days 7 "
                f"--region {region}\n")
    family = catalog.family_of(fit.instance_type)
    name = f"{w.mode}-{family}"
    if w.training and fit.nodes > 1:
        capacity = "spot_percent: 0          # one interrupted node stops a multi-node job"
    elif w.training:
        capacity = "spot_percent: 100        # checkpoint through spot.interruption_command"
    else:
        capacity = "spot_percent: 0          # serving: no interruptions"
    # Pin the group to zones that offer the type (one for EFA), so the spec's offerings check passes
    # whatever else the network holds; the network must list them.
    offered = catalog.offered_zones(fit.instance_type, region) or []
    chosen = [zone] if zone else offered[:1] if fit.nodes > 1 else offered
    zones = (f"    # network.availability_zones must list {'it' if len(chosen) == 1 else 'them'}\n"
             f"    availability_zones: [{', '.join(chosen)}]\n") if chosen else ""
    efa = "efa: on\n    placement_group: true" if fit.nodes > 1 else "efa: off"
    return (
        summary
        + "gpucluster:node_groups:\n"
        f"  - name: {name}\n"
        f"    instance_types: [{fit.instance_type}]\n"
        "    min_nodes: 0\n"
        f"    desired_nodes: {fit.nodes}\n"
        f"    max_nodes: {fit.nodes}\n"
        + zones
        + "    capacity:\n"
        f"      {capacity}\n"
        f"    {efa}\n"
    )
