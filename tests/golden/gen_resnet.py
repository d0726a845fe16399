"""Golden values for the ResNets of the vision zoo (tests/test_golden_resnet.c).

Debian's torch has no torchvision, so the ResNets are written here by hand with torchvision's module
names (conv1, bn1, layer1.0.conv1, layer1.0.downsample.0, fc), plus He et al.'s option-A shortcut
for the CIFAR nets. The widths are reduced so the file stays small; the code paths are the ones of
the full presets (same depth for ResNet-20, same block and stem structure for ResNet-18/50).

For each case <c>: the state_dict before the step as <c>.w.<name> (BatchNorm weights, biases and
running statistics randomised so they are not the trivial 1/0), the input <c>.x and labels <c>.y,
then one train-mode forward: <c>.logits, <c>.loss (mean cross-entropy), every parameter gradient
<c>.g.<name> from loss.backward(), the running statistics after the forward as <c>.after.<name>
(momentum 0.1), and an eval-mode forward with those statistics, <c>.eval_logits.
Run: /usr/bin/python3 tests/golden/gen_resnet.py  (from the repository root)."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwrite  # noqa: E402

torch.manual_seed(0)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inp, planes, stride, shortcut):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.stride, self.inp, self.out = stride, inp, planes
        self.pad = stride != 1 or inp != planes
        self.downsample = None
        if self.pad and shortcut == "B":
            self.downsample = nn.Sequential(nn.Conv2d(inp, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def shortcut(self, x):
        if self.downsample is not None:
            return self.downsample(x)
        if not self.pad:
            return x
        x = x[:, :, ::self.stride, ::self.stride]
        lo = (self.out - self.inp) // 2
        return F.pad(x, (0, 0, 0, 0, lo, self.out - self.inp - lo))

    def forward(self, x):
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return self.relu(h + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inp, planes, stride, shortcut):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inp, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or inp != out:
            self.downsample = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return self.relu(h + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self, block, layers, widths, cifar, shortcut, num_classes):
        super().__init__()
        w0 = widths[0]
        if cifar:
            self.conv1 = nn.Conv2d(3, w0, 3, 1, 1, bias=False)
        else:
            self.conv1 = nn.Conv2d(3, w0, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w0)
        self.relu = nn.ReLU()
        self.maxpool = None if cifar else nn.MaxPool2d(3, 2, 1)
        ch = w0
        for i, (n, w) in enumerate(zip(layers, widths)):
            blocks = []
            for j in range(n):
                blocks.append(block(ch, w, 2 if i > 0 and j == 0 else 1, shortcut))
                ch = w * block.expansion
            setattr(self, "layer%d" % (i + 1), nn.Sequential(*blocks))
        self.n_stages = len(layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(ch, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        if self.maxpool is not None:
            x = self.maxpool(x)
        for i in range(self.n_stages):
            x = getattr(self, "layer%d" % (i + 1))(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


# name: (block, layers, widths, cifar stem, shortcut, classes, input shape)
CASES = {
    "r20": (BasicBlock, [3, 3, 3], [4, 8, 16], True, "A", 10, (2, 3, 32, 32)),
    "rn18": (BasicBlock, [2, 2, 2, 2], [2, 4, 8, 16], False, "B", 7, (2, 3, 36, 36)),
    "rn50": (Bottleneck, [2, 1, 1, 1], [2, 4, 8, 16], False, "B", 5, (2, 3, 36, 36)),
}

out = {}
for name, (block, layers, widths, cifar, sc, classes, shape) in CASES.items():
    net = ResNet(block, layers, widths, cifar, sc, classes)
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0, 0.1)
                mod.running_mean.normal_(0, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.num_batches_tracked.fill_(3)
    for k, v in net.state_dict().items():
        out["%s.w.%s" % (name, k)] = v.clone()
    x = torch.randn(*shape)
    y = torch.randint(0, classes, (shape[0],))
    net.train()
    logits = net(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    out[name + ".x"] = x
    out[name + ".y"] = y
    out[name + ".logits"] = logits.detach()
    out[name + ".loss"] = loss.detach().reshape(())
    for k, p in net.named_parameters():
        out["%s.g.%s" % (name, k)] = p.grad
    for k, v in net.state_dict().items():
        if "running" in k or "num_batches" in k:
            out["%s.after.%s" % (name, k)] = v.clone()
    net.eval()
    with torch.no_grad():
        out[name + ".eval_logits"] = net(x)
    print(name, sum(p.numel() for p in net.parameters()), "parameters")

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resnet.safetensors")
stwrite.save(path, out)
print("wrote", path, os.path.getsize(path), "bytes")
