"""Image classification data: digits (embedded), CIFAR-10/100 (official binary archives),
ImageNet-100-style image folders; plus the standard augmentation.

All loaders return a :class:`VisionData` with image tensors ``(N, C, S, S)`` stored in
their raw range (uint8 0..255, digits 0..16) and per-channel mean/std for normalisation.

==========  =====================================================================
name        source
==========  =====================================================================
digits      scikit-learn's ``load_digits`` (8x8 grey, 10 classes, 1797 images,
            shipped with scikit-learn): fixed stratified 75/25 split (seed 0)
cifar10     ``DATA_DIR/data_batch_{1..5}.bin`` + ``test_batch.bin`` (the official
            "CIFAR-10 binary version": records of 1 label byte + 3072 pixel bytes)
cifar100    ``DATA_DIR/train.bin`` + ``test.bin`` ("CIFAR-100 binary version":
            1 coarse + 1 fine label byte + 3072 pixel bytes; fine labels used)
imagefolder ``DATA_DIR/train/<class>/*.{jpg,jpeg,png}`` and ``DATA_DIR/val/<class>/...``
            (ImageNet-100 layout), read with Pillow, resized to ``image_size``
==========  =====================================================================

Nothing is unpickled: the CIFAR *python* archives are deliberately not supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from masklab.util.errors import MasklabError

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder")
CIFAR_PIXELS = 3 * 32 * 32
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


@dataclass
class VisionData:
    """Images ``(N, C, S, S)`` in their raw range ``[0, scale]``; labels ``(N,)`` int64."""

    name: str
    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    classes: int
    scale: float
    pad: int  # random-crop padding of the augmentation (pixels)
    flip: bool  # random horizontal flips

    @property
    def channels(self) -> int:
        return self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        return self.train_x.shape[-1]

    def stats(self) -> tuple[Tensor, Tensor]:
        """Per-channel mean and std of the training images in [0, 1]: ``(C, 1, 1)`` each."""
        x = self.train_x[:10000].float() / self.scale
        return x.mean(dim=(0, 2, 3))[:, None, None], x.std(dim=(0, 2, 3))[:, None, None].clamp_min(1e-6)


def normalise(x: Tensor, data: VisionData, mean: Tensor, std: Tensor) -> Tensor:
    return (x.float() / data.scale - mean) / std


def augment(x: Tensor, pad: int, flip: bool, gen: torch.Generator) -> Tensor:
    """Standard augmentation of a batch ``(B, C, S, S)``: random crop after zero padding by
    ``pad`` pixels, and random horizontal flips. All randomness comes from ``gen``."""
    B, C, S, _ = x.shape
    if pad > 0:
        padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (B,), generator=gen)
        dx = torch.randint(0, 2 * pad + 1, (B,), generator=gen)
        rows = (dy[:, None] + torch.arange(S))[:, None, :, None].expand(B, C, S, S + 2 * pad)
        x = padded.gather(2, rows)
        cols = (dx[:, None] + torch.arange(S))[:, None, None, :].expand(B, C, S, S)
        x = x.gather(3, cols)
    if flip:
        mirror = torch.rand(B, generator=gen) < 0.5
        x = torch.where(mirror[:, None, None, None], x.flip(-1), x)
    return x


# ----------------------------------------------------------------------------- loaders


def load_digits() -> VisionData:
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError:  # pragma: no cover - a dependency of masklab
        raise MasklabError("the digits data set needs scikit-learn: pip install scikit-learn") from None
    d = sk_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None]  # (1797, 1, 8, 8), values 0..16
    y = torch.tensor(d.target, dtype=torch.int64)
    rng = np.random.default_rng(0)
    test = np.zeros(len(y), dtype=bool)
    for c in range(10):  # stratified: a quarter of each class is test
        idx = np.flatnonzero(d.target == c)
        test[rng.permutation(idx)[: len(idx) // 4]] = True
    test_t = torch.from_numpy(test)
    return VisionData("digits", x[~test_t], y[~test_t], x[test_t], y[test_t], 10, 16.0, pad=1, flip=False)


def _data_dir(data_dir: str | Path | None, name: str, expect: str) -> Path:
    if not data_dir:
        raise MasklabError(f"{name} needs --data-dir: a local folder with {expect}")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise MasklabError(f"data directory {path} does not exist; --data-dir must be a folder with {expect}")
    return path


def read_cifar_bin(path: Path, label_bytes: int) -> tuple[Tensor, Tensor]:
    """One CIFAR binary file -> images ``(N, 3, 32, 32)`` uint8 and labels ``(N,)`` (the
    last label byte of each record: CIFAR-10's label, CIFAR-100's fine label)."""
    raw = np.fromfile(path, dtype=np.uint8)
    record = label_bytes + CIFAR_PIXELS
    if raw.size == 0 or raw.size % record:
        raise MasklabError(
            f"{path} is not a CIFAR binary file: {raw.size} bytes is not a multiple of the {record}-byte record"
        )
    rec = raw.reshape(-1, record)
    x = torch.from_numpy(rec[:, label_bytes:].copy()).view(-1, 3, 32, 32)
    y = torch.from_numpy(rec[:, label_bytes - 1].astype(np.int64))
    return x, y


def load_cifar(data_dir: str | Path | None, which: str = "cifar10") -> VisionData:
    if which == "cifar10":
        expect = "the CIFAR-10 binary version (data_batch_1.bin ... data_batch_5.bin, test_batch.bin)"
        path = _data_dir(data_dir, which, expect)
        train_files = sorted(path.glob("data_batch_*.bin"))
        test_files = [path / "test_batch.bin"]
        label_bytes, classes = 1, 10
    elif which == "cifar100":
        expect = "the CIFAR-100 binary version (train.bin, test.bin)"
        path = _data_dir(data_dir, which, expect)
        train_files, test_files = [path / "train.bin"], [path / "test.bin"]
        label_bytes, classes = 2, 100
    else:
        raise MasklabError(f"unknown CIFAR variant {which!r}")
    missing = [f.name for f in [*train_files, *test_files] if not f.exists()]
    if not train_files or missing:
        raise MasklabError(f"{path} is missing {', '.join(missing) or 'data_batch_*.bin'}; expected {expect}")
    parts = [read_cifar_bin(f, label_bytes) for f in train_files]
    test_x, test_y = read_cifar_bin(test_files[0], label_bytes)
    train_x, train_y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    if int(max(train_y.max(), test_y.max())) >= classes:
        raise MasklabError(f"{path}: labels >= {classes}; is this really {which} (binary version)?")
    return VisionData(which, train_x, train_y, test_x, test_y, classes, 255.0, pad=4, flip=True)


def _read_split(split: Path, classes: list[str], image_size: int) -> tuple[Tensor, Tensor]:
    from PIL import Image, UnidentifiedImageError

    xs, ys = [], []
    for label, name in enumerate(classes):
        for f in sorted((split / name).iterdir()):
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                with Image.open(f) as im:
                    im = im.convert("RGB").resize((image_size, image_size), Image.BILINEAR)
                    xs.append(np.asarray(im, dtype=np.uint8))
            except (UnidentifiedImageError, OSError) as e:
                raise MasklabError(f"cannot read image {f}: {e}") from None
            ys.append(label)
    if not xs:
        raise MasklabError(f"{split} holds no images (expected {split}/<class>/*.jpg or *.png)")
    x = torch.from_numpy(np.stack(xs)).permute(0, 3, 1, 2).contiguous()
    return x, torch.tensor(ys, dtype=torch.int64)


def load_imagefolder(data_dir: str | Path | None, image_size: int = 64) -> VisionData:
    expect = "train/<class>/*.jpg and val/<class>/*.jpg (ImageNet-100 layout)"
    path = _data_dir(data_dir, "imagefolder", expect)
    if not (path / "train").is_dir() or not (path / "val").is_dir():
        raise MasklabError(f"{path} needs train/ and val/ sub-folders: {expect}")
    classes = sorted(d.name for d in (path / "train").iterdir() if d.is_dir())
    if len(classes) < 2:
        raise MasklabError(f"{path / 'train'} needs at least two class folders, found {len(classes)}")
    extra = sorted(d.name for d in (path / "val").iterdir() if d.is_dir() and d.name not in classes)
    if extra:
        raise MasklabError(f"{path / 'val'} has classes missing from train/: {', '.join(extra[:5])}")
    train_x, train_y = _read_split(path / "train", classes, image_size)
    test_x, test_y = _read_split(path / "val", [c for c in classes if (path / "val" / c).is_dir()], image_size)
    # val labels must index the train class list
    val_classes = [c for c in classes if (path / "val" / c).is_dir()]
    test_y = torch.tensor([classes.index(val_classes[i]) for i in test_y.tolist()], dtype=torch.int64)
    return VisionData(
        "imagefolder", train_x, train_y, test_x, test_y, len(classes), 255.0, pad=max(1, image_size // 8), flip=True
    )


def load_vision(name: str, data_dir: str | Path | None = None, image_size: int = 64) -> VisionData:
    """Load data set ``name`` (one of :data:`DATASETS`)."""
    if name == "digits":
        return load_digits()
    if name in ("cifar10", "cifar100"):
        return load_cifar(data_dir, name)
    if name == "imagefolder":
        return load_imagefolder(data_dir, image_size)
    raise MasklabError(f"unknown data set {name!r}; choose from {', '.join(DATASETS)}")
