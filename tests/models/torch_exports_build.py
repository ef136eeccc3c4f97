"""Build the PyTorch-exported fixtures of ``real_exports.py``: ``python torch_exports_build.py OUT_DIR``.

Run in an environment with torch (``real_exports.torch_env()`` makes one; the project's own never has
torch). Trains a small CNN for a few seconds on a task with a right answer (which quadrant of a noisy
image holds a bright square: 4 classes, seeded), so its weights are trained and its top-1 means something,
then exports it twice:

* ``cnn_torchscript.onnx``: the TorchScript-based exporter (``dynamo=False``), opset 13, dynamic batch,
  height and width (``dynamic_axes``);
* ``cnn_dynamo.onnx``: the dynamo exporter (``dynamo=True``), opset 18, the same dims dynamic
  (``dynamic_shapes``).

Both are checked against PyTorch in ONNX Runtime at two shapes before they are written.
"""

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn


class QuadrantNet(nn.Module):
    """Conv-BN-ReLU x3 (strided), the mean of each quadrant, linear head: any input size of 16 or more."""

    def __init__(self) -> None:
        super().__init__()
        layers, channels = [], 1
        for width in (8, 16, 32):
            layers += [nn.Conv2d(channels, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
            channels = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(32 * 4, 4)

    def forward(self, x):
        features = self.features(x)
        # Mean of each quadrant: keeps where in the image, and exports as Shape/Gather/Div/Slice arithmetic.
        h, w = features.shape[2] // 2, features.shape[3] // 2
        quadrants = [
            features[:, :, :h, :w], features[:, :, :h, w:], features[:, :, h:, :w], features[:, :, h:, w:]
        ]
        return self.head(torch.cat([q.mean((2, 3)) for q in quadrants], 1))


def batch(rng: np.random.Generator, count: int, size: int = 32):
    images = rng.normal(0, 0.3, (count, 1, size, size)).astype(np.float32)
    labels = rng.integers(0, 4, count)
    half = size // 2
    for index, label in enumerate(labels):
        top, left = (label // 2) * half, (label % 2) * half
        row, col = rng.integers(0, half - 4, 2)
        images[index, 0, top + row : top + row + 4, left + col : left + col + 4] += 2.0
    return torch.from_numpy(images), torch.from_numpy(labels)


def train(seed: int = 0) -> QuadrantNet:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = QuadrantNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        images, labels = batch(rng, 64)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    images, labels = batch(np.random.default_rng(seed + 1), 256)
    with torch.no_grad():
        accuracy = (model(images).argmax(1) == labels).float().mean().item()
    if accuracy < 0.9:
        raise SystemExit(f"the fixture CNN trained to only {accuracy:.2f} top-1 on held-out images")
    return model


def check(path: Path, model: QuadrantNet) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in ((1, 1, 32, 32), (3, 1, 48, 40)):
        x = torch.randn(*shape)
        with torch.no_grad():
            want = model(x).numpy()
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        if np.abs(got - want).max() > 1e-4:
            raise SystemExit(f"{path.name}: ONNX Runtime differs from PyTorch at {shape}")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = train()
    example = (torch.randn(2, 1, 32, 32),)
    script_path = out / "cnn_torchscript.onnx"
    torch.onnx.export(
        model, example, str(script_path), dynamo=False, opset_version=13, input_names=["image"],
        output_names=["logits"], dynamic_axes={"image": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}},
    )  # fmt: skip
    check(script_path, model)
    dynamo_path = out / "cnn_dynamo.onnx"
    batch_dim, height, width = torch.export.Dim("batch"), torch.export.Dim("height", min=16), torch.export.Dim("width", min=16)
    program = torch.onnx.export(
        model, example, dynamo=True, opset_version=18, input_names=["image"], output_names=["logits"],
        dynamic_shapes=({0: batch_dim, 2: height, 3: width},),
    )  # fmt: skip
    program.save(str(dynamo_path))
    check(dynamo_path, model)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
