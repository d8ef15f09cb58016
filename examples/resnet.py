"""ResNet-18, -34 and -50 (He et al., "Deep Residual Learning", 2015) for examples/imagenet.py.

Used when torchvision is not installed. The module names and shapes are torchvision's
(``conv1``, ``bn1``, ``layer1.0.conv1``, ``layer2.0.downsample.0``, ``fc``; the ResNet-50
bottleneck strides in its 3x3 convolution, as torchvision's "v1.5"), so a state dict saved
from one loads into the other. Weights start from He initialization; nothing is downloaded.

    >>> model = resnet("resnet18", num_classes=1000)
    >>> sum(p.numel() for p in model.parameters())
    11689512
"""

from __future__ import annotations

import torch
from torch import nn

ARCHS = ("resnet18", "resnet34", "resnet50")


def conv3x3(inputs: int, outputs: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inputs, outputs, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(inputs: int, outputs: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inputs, outputs, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions and a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(
        self, inputs: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = conv3x3(inputs, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + shortcut)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, and a shortcut (ResNet-50)."""

    expansion = 4

    def __init__(
        self, inputs: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = conv1x1(inputs, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    """A 7x7 stem, four stages of residual blocks (the last three halve the resolution),
    global average pooling and one linear classifier."""

    def __init__(
        self, block: type[BasicBlock | Bottleneck], depths: list[int], num_classes: int
    ) -> None:
        super().__init__()
        self.inputs = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._stage(block, 64, depths[0], stride=1)
        self.layer2 = self._stage(block, 128, depths[1], stride=2)
        self.layer3 = self._stage(block, 256, depths[2], stride=2)
        self.layer4 = self._stage(block, 512, depths[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        self._initialize()

    def _stage(
        self, block: type[BasicBlock | Bottleneck], planes: int, depth: int, stride: int
    ) -> nn.Sequential:
        outputs = planes * block.expansion
        downsample = None
        if stride != 1 or self.inputs != outputs:  # the shortcut must match shape
            downsample = nn.Sequential(
                conv1x1(self.inputs, outputs, stride), nn.BatchNorm2d(outputs)
            )
        blocks = [block(self.inputs, planes, stride, downsample)]
        self.inputs = outputs
        blocks += [block(outputs, planes) for _ in range(1, depth)]
        return nn.Sequential(*blocks)

    def _initialize(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet(arch: str, num_classes: int) -> ResNet:
    """``resnet18``, ``resnet34`` or ``resnet50`` with ``num_classes`` outputs.

    >>> resnet("resnet50", 10).fc
    Linear(in_features=2048, out_features=10, bias=True)
    """
    shapes = {
        "resnet18": (BasicBlock, [2, 2, 2, 2]),
        "resnet34": (BasicBlock, [3, 4, 6, 3]),
        "resnet50": (Bottleneck, [3, 4, 6, 3]),
    }
    if arch not in shapes:
        raise ValueError(f"--arch {arch!r} is not one of {', '.join(ARCHS)}")
    block, depths = shapes[arch]
    return ResNet(block, depths, num_classes)
