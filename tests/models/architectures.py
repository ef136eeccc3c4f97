"""Small real architectures in plain PyTorch, written the way the reference implementations write them,
so their ONNX exports carry the patterns Flex-DSA fuses (decomposed LayerNorm, erf and tanh GELU,
RMSNorm, rotary embeddings, SiLU-gated MLPs, scaled-dot-product attention with additive masks,
Conv + BatchNorm, ReLU6, depthwise convolutions).

Used by ``tests/models/build_fixtures.py`` (tiny fixtures committed to the repo) and by ``bench/``
(the same graphs at realistic widths). Weights are random (seeded); no checkpoint is ever downloaded.

Each ``build_<arch>(config)`` returns an ``ExportSpec``: the module in eval mode, example inputs, input
and output names, and which input axes are dynamic. ``ARCHITECTURES`` maps a name to its builder and
its ``tiny`` / ``bench`` configs.

Only this module and its callers need torch; the tests never import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.nn import functional as F

# ----------------------------------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------------------------------


@dataclass
class ExportSpec:
    """Everything ``torch.onnx.export`` needs for one model."""

    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_names: list[str]
    output_names: list[str]
    # input/output name -> {axis: symbolic dim name}
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)
    # Opset that keeps the fusable patterns decomposed (LayerNormalization only exists from opset 17).
    opset: int = 14


def _init_weights(module: nn.Module, seed: int) -> None:
    """Seeded random weights with the usual small-normal scale, and non-trivial BatchNorm statistics
    so a Conv+BN fold is numerically visible."""
    generator = torch.Generator().manual_seed(seed)
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            sub.weight.data.normal_(0.0, 0.02, generator=generator)
            if getattr(sub, "bias", None) is not None:
                sub.bias.data.normal_(0.0, 0.02, generator=generator)
        elif isinstance(sub, nn.Conv2d):
            fan_in = sub.in_channels // sub.groups * sub.kernel_size[0] * sub.kernel_size[1]
            sub.weight.data.normal_(0.0, math.sqrt(2.0 / fan_in), generator=generator)
            if sub.bias is not None:
                sub.bias.data.zero_()
        elif isinstance(sub, nn.BatchNorm2d):
            sub.weight.data.uniform_(0.5, 1.5, generator=generator)
            sub.bias.data.normal_(0.0, 0.1, generator=generator)
            sub.running_mean.data.normal_(0.0, 0.1, generator=generator)
            sub.running_var.data.uniform_(0.5, 1.5, generator=generator)
        elif isinstance(sub, nn.LayerNorm):
            sub.weight.data.normal_(1.0, 0.02, generator=generator)
            sub.bias.data.normal_(0.0, 0.02, generator=generator)


def _finish(module: nn.Module, seed: int) -> nn.Module:
    _init_weights(module, seed)
    return module.eval()


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """BERT's GELU: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(batch, seq, hidden) -> (batch, heads, seq, head_dim)."""
    batch, seq, hidden = x.shape
    return x.view(batch, seq, num_heads, hidden // num_heads).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, head_dim) -> (batch, seq, hidden)."""
    batch, heads, seq, head_dim = x.shape
    return x.transpose(1, 2).contiguous().view(batch, seq, heads * head_dim)


# ----------------------------------------------------------------------------------------------------
# BERT: post-LN encoder, erf GELU, additive attention mask
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 256
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 128
    max_positions: int = 64
    type_vocab: int = 2
    seq: int = 16
    batch: int = 1
    eps: float = 1e-12
    seed: int = 0


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.heads = config.heads
        self.head_dim = config.hidden // config.heads
        self.query = nn.Linear(config.hidden, config.hidden)
        self.key = nn.Linear(config.hidden, config.hidden)
        self.value = nn.Linear(config.hidden, config.hidden)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        q = _split_heads(self.query(hidden), self.heads)
        k = _split_heads(self.key(hidden), self.heads)
        v = _split_heads(self.value(hidden), self.heads)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores + additive_mask
        probs = self.dropout(torch.softmax(scores, dim=-1))
        return _merge_heads(torch.matmul(probs, v))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(config)
        self.attention_output = nn.Linear(config.hidden, config.hidden)
        self.attention_norm = nn.LayerNorm(config.hidden, eps=config.eps)
        self.intermediate = nn.Linear(config.hidden, config.intermediate)
        self.output = nn.Linear(config.intermediate, config.hidden)
        self.output_norm = nn.LayerNorm(config.hidden, eps=config.eps)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        attended = self.dropout(self.attention_output(self.attention(hidden, additive_mask)))
        hidden = self.attention_norm(attended + hidden)
        feed_forward = self.dropout(self.output(gelu_erf(self.intermediate(hidden))))
        return self.output_norm(feed_forward + hidden)


class Bert(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden)
        self.position_embeddings = nn.Embedding(config.max_positions, config.hidden)
        self.token_type_embeddings = nn.Embedding(config.type_vocab, config.hidden)
        self.embedding_norm = nn.LayerNorm(config.hidden, eps=config.eps)
        self.dropout = nn.Dropout(0.1)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.layers))
        self.pooler = nn.Linear(config.hidden, config.hidden)
        self.register_buffer(
            "position_ids", torch.arange(config.max_positions).unsqueeze(0), persistent=False
        )

    def forward(self, input_ids, attention_mask, token_type_ids):
        seq = input_ids.shape[1]
        embeddings = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(self.position_ids[:, :seq])
            + self.token_type_embeddings(token_type_ids)
        )
        hidden = self.dropout(self.embedding_norm(embeddings))
        # (batch, seq) of 1/0 -> (batch, 1, 1, seq) of 0 / large negative, added to the scores.
        additive_mask = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(
            hidden.dtype
        ).min
        for layer in self.layers:
            hidden = layer(hidden, additive_mask)
        pooled = torch.tanh(self.pooler(hidden[:, 0]))
        return hidden, pooled


def build_bert(config: BertConfig) -> ExportSpec:
    generator = torch.Generator().manual_seed(config.seed + 1)
    input_ids = torch.randint(0, config.vocab_size, (config.batch, config.seq), generator=generator)
    attention_mask = torch.ones(config.batch, config.seq, dtype=torch.int64)
    token_type_ids = torch.zeros(config.batch, config.seq, dtype=torch.int64)
    text = {0: "batch", 1: "seq"}
    return ExportSpec(
        module=_finish(Bert(config), config.seed),
        inputs=(input_ids, attention_mask, token_type_ids),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_axes={
            "input_ids": text,
            "attention_mask": text,
            "token_type_ids": text,
            "last_hidden_state": text,
            "pooler_output": {0: "batch"},
        },
    )


# ----------------------------------------------------------------------------------------------------
# GPT-2: pre-LN decoder, causal mask, tanh GELU, tied LM head
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpt2Config:
    vocab_size: int = 256
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 128
    max_positions: int = 64
    seq: int = 16
    batch: int = 1
    eps: float = 1e-5
    seed: int = 0


class Gpt2Attention(nn.Module):
    def __init__(self, config: Gpt2Config):
        super().__init__()
        self.heads = config.heads
        self.hidden = config.hidden
        self.c_attn = nn.Linear(config.hidden, 3 * config.hidden)
        self.c_proj = nn.Linear(config.hidden, config.hidden)
        causal = torch.tril(torch.ones(config.max_positions, config.max_positions, dtype=torch.bool))
        self.register_buffer(
            "causal", causal.view(1, 1, config.max_positions, config.max_positions), persistent=False
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(hidden).split(self.hidden, dim=2)
        q, k, v = (_split_heads(t, self.heads) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        seq = hidden.shape[1]
        mask = self.causal[:, :, :seq, :seq]
        scores = torch.where(mask, scores, torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
        probs = torch.softmax(scores, dim=-1)
        return self.c_proj(_merge_heads(torch.matmul(probs, v)))


class Gpt2Block(nn.Module):
    def __init__(self, config: Gpt2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden, eps=config.eps)
        self.attn = Gpt2Attention(config)
        self.ln_2 = nn.LayerNorm(config.hidden, eps=config.eps)
        self.c_fc = nn.Linear(config.hidden, config.intermediate)
        self.mlp_proj = nn.Linear(config.intermediate, config.hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.ln_1(hidden))
        return hidden + self.mlp_proj(gelu_new(self.c_fc(self.ln_2(hidden))))


class Gpt2(nn.Module):
    def __init__(self, config: Gpt2Config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.hidden)
        self.wpe = nn.Embedding(config.max_positions, config.hidden)
        self.blocks = nn.ModuleList(Gpt2Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.hidden, eps=config.eps)
        self.register_buffer(
            "position_ids", torch.arange(config.max_positions).unsqueeze(0), persistent=False
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        hidden = self.wte(input_ids) + self.wpe(self.position_ids[:, :seq])
        for block in self.blocks:
            hidden = block(hidden)
        # The LM head shares the token embedding (weight tying), as in GPT-2.
        return torch.matmul(self.ln_f(hidden), self.wte.weight.t())


def _decoder_spec(module: nn.Module, config) -> ExportSpec:
    """A decoder-only language model: token ids in, logits out, batch and sequence dynamic."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    input_ids = torch.randint(0, config.vocab_size, (config.batch, config.seq), generator=generator)
    text = {0: "batch", 1: "seq"}
    return ExportSpec(
        module=_finish(module, config.seed),
        inputs=(input_ids,),
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_axes={"input_ids": text, "logits": text},
    )


def build_gpt2(config: Gpt2Config) -> ExportSpec:
    return _decoder_spec(Gpt2(config), config)


# ----------------------------------------------------------------------------------------------------
# Llama: RMSNorm, rotary position embedding, grouped-query attention, SiLU-gated MLP
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 256
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    max_positions: int = 64
    rope_theta: float = 10000.0
    seq: int = 16
    batch: int = 1
    eps: float = 1e-6
    seed: int = 0


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 as Llama does."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.heads = config.heads
        self.kv_heads = config.kv_heads
        self.head_dim = config.hidden // config.heads
        self.q_proj = nn.Linear(config.hidden, config.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden, config.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden, config.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.heads * self.head_dim, config.hidden, bias=False)

    def _repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, kv_heads, seq, d) -> (batch, heads, seq, d) by repeating each kv head."""
        groups = self.heads // self.kv_heads
        if groups == 1:
            return x
        batch, kv_heads, seq, head_dim = x.shape
        x = x[:, :, None, :, :].expand(batch, kv_heads, groups, seq, head_dim)
        return x.reshape(batch, kv_heads * groups, seq, head_dim)

    def forward(self, hidden, cos, sin, causal_mask):
        batch, seq, _ = hidden.shape
        q = self.q_proj(hidden).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim) + causal_mask
        probs = torch.softmax(scores.to(torch.float32), dim=-1).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_norm = RMSNorm(config.hidden, config.eps)
        self.attn = LlamaAttention(config)
        self.post_attention_norm = RMSNorm(config.hidden, config.eps)
        self.mlp = LlamaMLP(config)

    def forward(self, hidden, cos, sin, causal_mask):
        hidden = hidden + self.attn(self.input_norm(hidden), cos, sin, causal_mask)
        return hidden + self.mlp(self.post_attention_norm(hidden))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        head_dim = config.hidden // config.heads
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden)
        self.blocks = nn.ModuleList(LlamaBlock(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(config.max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos_cached", angles.cos(), persistent=False)
        self.register_buffer("sin_cached", angles.sin(), persistent=False)
        causal = torch.full(
            (config.max_positions, config.max_positions), torch.finfo(torch.float32).min
        ).triu(1)
        self.register_buffer("causal_cached", causal, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        hidden = self.embed_tokens(input_ids)
        cos = self.cos_cached[:seq][None, None]
        sin = self.sin_cached[:seq][None, None]
        causal_mask = self.causal_cached[:seq, :seq][None, None]
        for block in self.blocks:
            hidden = block(hidden, cos, sin, causal_mask)
        return self.lm_head(self.norm(hidden))


def build_llama(config: LlamaConfig) -> ExportSpec:
    return _decoder_spec(Llama(config), config)


# ----------------------------------------------------------------------------------------------------
# ViT: patch convolution, class token, pre-LN encoder
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VitConfig:
    image: int = 32
    patch: int = 8
    channels: int = 3
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 128
    classes: int = 10
    batch: int = 1
    eps: float = 1e-6
    seed: int = 0


class VitAttention(nn.Module):
    def __init__(self, config: VitConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.proj = nn.Linear(config.hidden, config.hidden)
        self.scale = (config.hidden // config.heads) ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, hidden = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        probs = torch.softmax(torch.matmul(q * self.scale, k.transpose(-2, -1)), dim=-1)
        return self.proj(torch.matmul(probs, v).transpose(1, 2).reshape(batch, tokens, hidden))


class VitBlock(nn.Module):
    def __init__(self, config: VitConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden, eps=config.eps)
        self.attn = VitAttention(config)
        self.norm2 = nn.LayerNorm(config.hidden, eps=config.eps)
        self.fc1 = nn.Linear(config.hidden, config.intermediate)
        self.fc2 = nn.Linear(config.intermediate, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Vit(nn.Module):
    def __init__(self, config: VitConfig):
        super().__init__()
        patches = (config.image // config.patch) ** 2
        self.patch_embed = nn.Conv2d(config.channels, config.hidden, config.patch, stride=config.patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, config.hidden) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, patches + 1, config.hidden) * 0.02)
        self.blocks = nn.ModuleList(VitBlock(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.hidden, eps=config.eps)
        self.head = nn.Linear(config.hidden, config.classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixel_values).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def build_vit(config: VitConfig) -> ExportSpec:
    torch.manual_seed(config.seed)  # cls_token / pos_embed are drawn in __init__
    pixels = torch.randn(
        config.batch,
        config.channels,
        config.image,
        config.image,
        generator=torch.Generator().manual_seed(config.seed + 1),
    )
    return ExportSpec(
        module=_finish(Vit(config), config.seed),
        inputs=(pixels,),
        input_names=["pixel_values"],
        output_names=["logits"],
        dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
    )


# ----------------------------------------------------------------------------------------------------
# ResNet: BasicBlocks with BatchNorm (eval mode, not folded)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResNetConfig:
    image: int = 64
    widths: tuple[int, ...] = (8, 16, 32, 64)
    blocks: tuple[int, ...] = (1, 1, 1, 1)
    classes: int = 10
    batch: int = 1
    seed: int = 0


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, config: ResNetConfig):
        super().__init__()
        stem = config.widths[0]
        self.conv1 = nn.Conv2d(3, stem, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, in_channels = [], stem
        for index, (width, count) in enumerate(zip(config.widths, config.blocks, strict=True)):
            for block in range(count):
                stride = 2 if index > 0 and block == 0 else 1
                stages.append(BasicBlock(in_channels, width, stride))
                in_channels = width
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(in_channels, config.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _image_spec(module: nn.Module, config, seed: int) -> ExportSpec:
    pixels = torch.randn(
        config.batch, 3, config.image, config.image, generator=torch.Generator().manual_seed(seed + 1)
    )
    return ExportSpec(
        module=_finish(module, seed),
        inputs=(pixels,),
        input_names=["pixel_values"],
        output_names=["logits"],
        dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
    )


def build_resnet(config: ResNetConfig) -> ExportSpec:
    return _image_spec(ResNet(config), config, config.seed)


# ----------------------------------------------------------------------------------------------------
# MobileNetV2: inverted residuals, depthwise convolutions, ReLU6, BatchNorm
# ----------------------------------------------------------------------------------------------------

# (expansion t, channels c, repeats n, stride s) of the MobileNetV2 paper, table 2.
MOBILENET_V2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


@dataclass(frozen=True)
class MobileNetV2Config:
    image: int = 64
    width: float = 0.25
    max_repeats: int = 1  # caps each stage's n; None-like large value keeps the paper's depth
    last_channels: int = 256
    classes: int = 10
    batch: int = 1
    seed: int = 0


def _make_divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv_bn_relu6(
    in_channels: int, out_channels: int, kernel: int, stride: int, groups: int = 1
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU6(),
    )


class InvertedResidual(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int):
        super().__init__()
        hidden = in_channels * expansion
        layers = [] if expansion == 1 else [_conv_bn_relu6(in_channels, hidden, 1, 1)]
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),  # depthwise
            nn.Conv2d(hidden, out_channels, 1, 1, 0, bias=False),  # linear bottleneck
            nn.BatchNorm2d(out_channels),
        ]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2(nn.Module):
    def __init__(self, config: MobileNetV2Config):
        super().__init__()
        in_channels = _make_divisible(32 * config.width)
        layers = [_conv_bn_relu6(3, in_channels, 3, 2)]
        for expansion, channels, repeats, stride in MOBILENET_V2_STAGES:
            out_channels = _make_divisible(channels * config.width)
            for index in range(min(repeats, config.max_repeats)):
                layers.append(
                    InvertedResidual(in_channels, out_channels, stride if index == 0 else 1, expansion)
                )
                in_channels = out_channels
        layers.append(_conv_bn_relu6(in_channels, config.last_channels, 1, 1))
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(config.last_channels, config.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(self.dropout(torch.flatten(x, 1)))


def build_mobilenet_v2(config: MobileNetV2Config) -> ExportSpec:
    return _image_spec(MobileNetV2(config), config, config.seed)


# ----------------------------------------------------------------------------------------------------
# Registry: name -> builder, tiny config (committed fixtures), bench config (realistic widths)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Architecture:
    build: Callable[..., ExportSpec]
    tiny: object
    bench: object
    kind: str  # "text" or "vision"


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(
        build_bert,
        tiny=BertConfig(),
        # BERT-base width, 4 of its 12 layers.
        bench=BertConfig(
            vocab_size=30522, hidden=768, layers=4, heads=12, intermediate=3072, max_positions=512, seq=128
        ),
        kind="text",
    ),
    "gpt2": Architecture(
        build_gpt2,
        tiny=Gpt2Config(),
        # GPT-2 small width, 4 of its 12 layers; the 50257-token LM head is part of the cost.
        bench=Gpt2Config(
            vocab_size=50257, hidden=768, layers=4, heads=12, intermediate=3072, max_positions=1024, seq=128
        ),
        kind="text",
    ),
    "llama": Architecture(
        build_llama,
        tiny=LlamaConfig(),
        bench=LlamaConfig(
            vocab_size=32000,
            hidden=768,
            layers=4,
            heads=12,
            kv_heads=4,
            intermediate=2048,
            max_positions=2048,
            seq=128,
        ),
        kind="text",
    ),
    "vit": Architecture(
        build_vit,
        tiny=VitConfig(),
        # ViT-B/16 width at 224x224, 4 of its 12 layers.
        bench=VitConfig(image=224, patch=16, hidden=768, layers=4, heads=12, intermediate=3072, classes=1000),
        kind="vision",
    ),
    "resnet": Architecture(
        build_resnet,
        tiny=ResNetConfig(),
        bench=ResNetConfig(
            image=224, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), classes=1000
        ),  # ResNet-18
        kind="vision",
    ),
    "mobilenetv2": Architecture(
        build_mobilenet_v2,
        tiny=MobileNetV2Config(),
        bench=MobileNetV2Config(image=224, width=1.0, max_repeats=99, last_channels=1280, classes=1000),
        kind="vision",
    ),
}


def export_spec(name: str, size: str = "tiny", **overrides) -> ExportSpec:
    """Build architecture ``name`` at ``size`` ("tiny" or "bench"), with config fields overridden."""
    arch = ARCHITECTURES[name]
    config = getattr(arch, size)
    if overrides:
        config = replace(config, **overrides)
    return arch.build(config)


def export_onnx(spec: ExportSpec, path, opset: int | None = None) -> None:
    """Export with the TorchScript-based exporter (``dynamo=False``): at opset 14 it writes LayerNorm,
    GELU and attention as their primitive ops, the form most deployed ONNX models have, and with
    ``do_constant_folding=False`` it keeps BatchNormalization nodes instead of folding them into Conv."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
        torch.onnx.export(
            spec.module,
            spec.inputs,
            str(path),
            dynamo=False,
            input_names=spec.input_names,
            output_names=spec.output_names,
            dynamic_axes=spec.dynamic_axes,
            opset_version=opset or spec.opset,
            training=torch.onnx.TrainingMode.EVAL,
            do_constant_folding=False,
        )
