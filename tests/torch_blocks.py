"""Small blocks in the style of the models people bring to ORTModule (shared by tests).

Each is written the way their modeling code writes it (transformers' Llama, GPT-2 and
ConvNeXt, torchvision's ResNet, a U-Net decoder), small enough to export in seconds:
``BLOCKS`` maps a name to ``(make() -> module, make_input() -> tensor)``.
"""

import math
from collections import namedtuple

import torch
from torch import nn
from torch.nn import functional as F
from torch_models import BasicBlock


class RMSNorm(nn.Module):
    """Llama's RMSNorm: ``x * rsqrt(mean(x^2) + eps) * weight``."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """RMSNorm, attention with rotary position embeddings, a SwiGLU MLP."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(dim, 2 * dim,
                                                                               bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _heads(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = self._heads(self.q(h)), self._heads(self.k(h)), self._heads(self.v(h))
        positions = torch.arange(t, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        attn = scores.softmax(-1) @ v
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class GPTBlock(nn.Module):
    """GPT-2's block: a fused QKV projection split in three, LayerNorm, GELU MLP."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ConvNeXtBlock(nn.Module):
    """A depthwise 7x7 convolution, LayerNorm over the channels (channels last), an MLP,
    then mean pooling and a head."""

    def __init__(self, dim=8, classes=3):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.dw(x).permute(0, 2, 3, 1)
        h = self.fc2(F.gelu(self.fc1(self.norm(h)))).permute(0, 3, 1, 2)
        return self.head((x + h).mean([-2, -1]))


class UNetDecoder(nn.Module):
    """Upsampling to the skip connection's size, concatenation, convolution."""

    def __init__(self, dim=4):
        super().__init__()
        self.down = nn.Conv2d(dim, dim, 3, stride=2, padding=1)
        self.conv = nn.Conv2d(2 * dim, dim, 3, padding=1)

    def forward(self, x):
        low = F.relu(self.down(x))
        up = F.interpolate(low, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.conv(torch.cat([up, x], dim=1))


class _ConvPoolHead(nn.Module):
    """A convolution, ``AdaptiveAvgPool2d`` to ``grid`` and a linear head of ``head_in``
    features; the subclasses say what reaches the head."""

    def __init__(self, grid, head_in, dim=4):
        super().__init__()
        self.conv = nn.Conv2d(3, dim, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(grid)
        self.head = nn.Linear(dim * head_in, 2)

    def pooled(self, x):
        return self.pool(F.relu(self.conv(x)))


class PooledMax(_ConvPoolHead):
    """``AdaptiveAvgPool2d`` to a grid larger than 1x1, ``torch.max`` over a dimension."""

    def __init__(self, dim=4):
        super().__init__((2, 3), 3, dim)

    def forward(self, x):
        values, _ = torch.max(self.pooled(x), dim=2)  # (N, dim, 2, 3) -> (N, dim, 3)
        return self.head(values.flatten(1))


class WindowedPool(_ConvPoolHead):
    """``AdaptiveAvgPool2d`` to a size that does not divide the map's (24 x 24 to 5 x 7):
    the dynamo exporter sums each window's elements one scalar-index Gather at a time."""

    def __init__(self, dim=4):
        super().__init__((5, 7), 35, dim)

    def forward(self, x):
        return self.head(self.pooled(x).flatten(1))


class PooledConv(nn.Module):
    """A convolution, ``AvgPool2d`` and ``interpolate(scale_factor=2)``: every dimension
    of ORTModule's export is symbolic, these resample along spatial axes."""

    def __init__(self, mode="bilinear"):
        super().__init__()
        self.mode = mode
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x):
        h = self.pool(F.relu(self.conv(x)))
        return F.interpolate(h, scale_factor=2, mode=self.mode)


Output = namedtuple("Output", ["logits", "hidden"])


class NamedOutput(nn.Module):
    """A namedtuple output, as modeling code returns."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(6, 8), nn.Linear(8, 2)

    def forward(self, x):
        hidden = torch.tanh(self.body(x))
        return Output(self.head(hidden), hidden)


def _seq(seed=1):
    return torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(seed))


def _image(channels, size=8, seed=1):
    return torch.randn(2, channels, size, size, generator=torch.Generator().manual_seed(seed))


BLOCKS = {
    "llama": (LlamaBlock, _seq),
    "gpt_fused_qkv": (GPTBlock, _seq),
    "convnext": (ConvNeXtBlock, lambda seed=1: _image(8, seed=seed)),
    "resnet": (lambda: BasicBlock(channels=8), lambda seed=1: _image(8, seed=seed)),
    "unet_decoder": (UNetDecoder, lambda seed=1: _image(4, seed=seed)),
    "pool_and_max": (PooledMax, lambda seed=1: _image(3, seed=seed)),
    "avgpool_interpolate": (PooledConv, lambda seed=1: _image(3, seed=seed)),
    "adaptive_pool_uneven_windows": (WindowedPool,
                                     lambda seed=1: _image(3, size=24, seed=seed)),
    "avgpool_interpolate_nearest": (lambda: PooledConv("nearest"),
                                    lambda seed=1: _image(3, seed=seed)),
    "avgpool_interpolate_bicubic": (lambda: PooledConv("bicubic"),
                                    lambda seed=1: _image(3, seed=seed)),
    "namedtuple_output": (NamedOutput, lambda seed=1: torch.randn(
        4, 6, generator=torch.Generator().manual_seed(seed))),
}
