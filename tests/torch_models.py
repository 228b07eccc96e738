"""PyTorch versions of zoo networks and small test models for the torch importer's tests.

The CNNs copy the architectures in src/dnnscale/workload/zoo.py, with attribute names equal to
the zoo's layer names (conv1, conv1_relu, conv1_pool, ..., flatten, fc1, ...), so layers can be
compared by name. Every factory takes no argument so it also works as ``--torch
torch_models:factory`` on the command line.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ZooCNN(nn.Module):
    """A chain of named modules, called in order."""

    def __init__(self, layers: list[tuple[str, nn.Module]]) -> None:
        super().__init__()
        self.names = [name for name, _ in layers]
        for name, layer in layers:
            self.add_module(name, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.names:
            x = getattr(self, name)(x)
        return x


def _conv(name: str, c_in: int, c_out: int, kernel: int, stride: int = 1, padding: int = 0,
          pool: tuple[int, int] | None = None) -> list[tuple[str, nn.Module]]:
    block: list[tuple[str, nn.Module]] = [
        (name, nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding)),
        (f"{name}_relu", nn.ReLU(inplace=True))]
    if pool is not None:
        block.append((f"{name}_pool", nn.MaxPool2d(pool[0], stride=pool[1])))
    return block


def _fc(name: str, n_in: int, n_out: int, last: bool = False) -> list[tuple[str, nn.Module]]:
    block: list[tuple[str, nn.Module]] = [(name, nn.Linear(n_in, n_out))]
    if not last:
        block.append((f"{name}_relu", nn.ReLU()))
    return block


def adam_cifar10() -> nn.Module:
    """zoo.adam_cifar10 without its softmax_loss (import with loss='cross_entropy')."""
    return ZooCNN(_conv("conv1", 3, 64, 5, padding=2, pool=(3, 2))
                  + _conv("conv2", 64, 64, 5, padding=2, pool=(3, 2))
                  + _conv("conv3", 64, 128, 3, padding=1, pool=(3, 2))
                  + [("flatten", nn.Flatten())]
                  + _fc("fc1", 1152, 512) + _fc("fc2", 512, 10, last=True))


def alexnet() -> nn.Module:
    """zoo.alexnet (torchvision's single tower, no dropout) without its loss."""
    return ZooCNN(_conv("conv1", 3, 64, 11, stride=4, padding=2, pool=(3, 2))
                  + _conv("conv2", 64, 192, 5, padding=2, pool=(3, 2))
                  + _conv("conv3", 192, 384, 3, padding=1)
                  + _conv("conv4", 384, 256, 3, padding=1)
                  + _conv("conv5", 256, 256, 3, padding=1, pool=(3, 2))
                  + [("flatten", nn.Flatten())]
                  + _fc("fc1", 9216, 4096) + _fc("fc2", 4096, 4096)
                  + _fc("fc3", 4096, 1000, last=True))


def vgg16() -> nn.Module:
    """zoo.vgg16 (configuration D, no dropout) without its loss."""
    layers: list[tuple[str, nn.Module]] = []
    c_in = 3
    for block, (channels, repeats) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3),
                                                 (512, 3)], start=1):
        for index in range(1, repeats + 1):
            layers += _conv(f"conv{block}_{index}", c_in, channels, 3, padding=1,
                            pool=(2, 2) if index == repeats else None)
            c_in = channels
    layers += ([("flatten", nn.Flatten())] + _fc("fc1", 25088, 4096) + _fc("fc2", 4096, 4096)
               + _fc("fc3", 4096, 1000, last=True))
    return ZooCNN(layers)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MHAttention(nn.Module):
    """Self-attention through nn.MultiheadAttention (not a leaf: out_proj is never called)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(width, heads, bias=False, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=False)[0]


class Block(nn.Module):
    def __init__(self, width: int, heads: int, use_mha: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width, bias=False)
        self.attn = MHAttention(width, heads) if use_mha else CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width, bias=False)
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A nanoGPT-style decoder: no biases, learned positions, tied output embedding."""

    def __init__(self, vocab: int = 2048, context: int = 64, width: int = 256, depth: int = 4,
                 heads: int = 4, use_mha: bool = False) -> None:
        super().__init__()
        self.context = context
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, use_mha) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width, bias=False)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def small_gpt() -> nn.Module:
    return GPT()


def small_gpt_mha() -> nn.Module:
    return GPT(use_mha=True)


def gpt_1b() -> nn.Module:
    """About 1.3e9 parameters: 24 blocks of width 2048, 50,304-token vocabulary."""
    return GPT(vocab=50_304, context=1024, width=2048, depth=24, heads=16)


class BasicBlock(nn.Module):
    """ResNet basic block (He et al., 2016) as in torchvision: the ReLU module is reused."""

    def __init__(self, c_in: int = 64, c_out: int = 64, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetTiny(nn.Module):
    """A stem conv, then a basic block that keeps the shape and one that downsamples."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.block1 = BasicBlock(64, 64)
        self.block2 = BasicBlock(64, 128, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(self.pool(self.block2(self.block1(self.stem(x))))))


def resnet_tiny() -> nn.Module:
    return ResNetTiny()


class DataDependent(nn.Module):
    """Chooses a branch from tensor values: cannot be traced without values."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(16, 1)
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate(x).mean() > 0:
            return self.a(x)
        return self.b(x)


def data_dependent() -> nn.Module:
    return DataDependent()


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1, 3x3 with the stride, 1x1 to 4x the width, batch norms,
    a projection shortcut where the shape changes."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
        self.shortcut = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(c_out))
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.shortcut is None else self.shortcut(x)
        return self.relu(self.body(x) + skip)


def resnet50() -> nn.Module:
    """zoo.resnet50 (v1.5, He et al. 2016 Table 1) without its loss."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                               nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    c_in = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            layers.append(Bottleneck(c_in, width, stride if block == 0 else 1))
            c_in = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)
