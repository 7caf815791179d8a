"""Vision: loaders on tiny files in the official formats, augmentation, the ViT, the four
inits' attention at step 0, and the CLI end to end (--quick)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from masklab.priors.bias import MaskPrior
from masklab.models import ViT
from masklab.priors.qk_init import QK_INITS
from masklab.priors.structures import allowed_mass
from masklab.lab.runner import MasklabError
from masklab.priors.structures import impulse_2d, locality_2d, neighbourhood_2d, offset_2d
from masklab.lab.tasks.vision import augment, load_cifar, load_digits, load_imagefolder, load_vision


def cifar_records(n: int, label_bytes: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n records in the CIFAR binary layout: label byte(s) then R, G, B planes of 32x32."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=(n, label_bytes), dtype=np.uint8)
    pixels = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    return np.concatenate([labels, pixels.reshape(n, -1)], axis=1), labels, pixels


def test_cifar10_binary_loader(tmp_path):
    expected = []
    for i in range(1, 6):
        rec, labels, pixels = cifar_records(3, 1, i)
        rec.tofile(tmp_path / f"data_batch_{i}.bin")
        expected.append((labels[:, 0], pixels))
    rec, labels, pixels = cifar_records(4, 1, 9)
    rec.tofile(tmp_path / "test_batch.bin")
    data = load_cifar(tmp_path, "cifar10")
    assert data.train_x.shape == (15, 3, 32, 32) and data.train_x.dtype == torch.uint8
    assert data.test_x.shape == (4, 3, 32, 32) and data.classes == 10
    assert np.array_equal(data.train_y[:3].numpy(), expected[0][0])
    assert np.array_equal(data.train_x[:3].numpy(), expected[0][1])  # channel planes in order
    assert np.array_equal(data.test_x.numpy(), pixels)


def test_cifar100_uses_fine_label(tmp_path):
    rec, labels, _ = cifar_records(5, 2, 0)
    rec.tofile(tmp_path / "train.bin")
    rec.tofile(tmp_path / "test.bin")
    data = load_cifar(tmp_path, "cifar100")
    assert data.classes == 100
    assert np.array_equal(data.train_y.numpy(), labels[:, 1])


def test_cifar_errors(tmp_path):
    with pytest.raises(MasklabError, match="needs --data-dir"):
        load_vision("cifar10", None)
    with pytest.raises(MasklabError, match="does not exist"):
        load_vision("cifar10", tmp_path / "nope")
    with pytest.raises(MasklabError, match="test_batch.bin"):
        load_vision("cifar10", tmp_path)
    for i in range(1, 6):
        (tmp_path / f"data_batch_{i}.bin").write_bytes(b"\x00" * 100)  # truncated
    (tmp_path / "test_batch.bin").write_bytes(b"\x00" * 3073)
    with pytest.raises(MasklabError, match="not a CIFAR binary file"):
        load_vision("cifar10", tmp_path)


def test_imagefolder_loader(tmp_path):
    from PIL import Image

    colours = {"ants": (255, 0, 0), "bees": (0, 0, 255)}
    for split, n in (("train", 3), ("val", 2)):
        for name, rgb in colours.items():
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (20, 14), rgb).save(tmp_path / split / name / f"{i}.png")
    data = load_imagefolder(tmp_path, image_size=8)
    assert data.train_x.shape == (6, 3, 8, 8) and data.test_x.shape == (4, 3, 8, 8)
    assert data.classes == 2 and data.train_y.tolist() == [0, 0, 0, 1, 1, 1]
    assert data.train_x[0, 0].float().mean() == 255 and data.train_x[-1, 2].float().mean() == 255
    (tmp_path / "train" / "ants" / "broken.jpg").write_bytes(b"not an image")
    with pytest.raises(MasklabError, match="cannot read image"):
        load_imagefolder(tmp_path, image_size=8)
    with pytest.raises(MasklabError, match="train/ and val/"):
        load_imagefolder(tmp_path / "train", image_size=8)


def test_digits_split():
    data = load_digits()
    assert data.train_x.shape[1:] == (1, 8, 8) and len(data.train_x) + len(data.test_x) == 1797
    assert set(data.test_y.tolist()) == set(range(10))
    assert 0.2 < len(data.test_x) / 1797 < 0.3


def test_augment_is_a_shifted_crop():
    gen = torch.Generator().manual_seed(0)
    x = torch.arange(2 * 1 * 6 * 6, dtype=torch.float32).reshape(2, 1, 6, 6) + 1
    assert torch.equal(augment(x, 0, False, gen), x)
    y = augment(x, 2, False, gen)
    assert y.shape == x.shape
    for b in range(2):  # every output is a window of the zero-padded input
        padded = torch.nn.functional.pad(x[b, 0], (2, 2, 2, 2))
        assert any(torch.equal(padded[i : i + 6, j : j + 6], y[b, 0]) for i in range(5) for j in range(5))
    flipped = augment(x, 0, True, torch.Generator().manual_seed(1))
    assert all(torch.equal(flipped[b], x[b]) or torch.equal(flipped[b], x[b].flip(-1)) for b in range(2))


def test_vit_patch_order_matches_structures():
    model = ViT(8, 2, 1, 10, dim=16, depth=1, heads=2)
    img = torch.zeros(1, 1, 8, 8)
    for r in range(4):
        for c in range(4):
            img[0, 0, 2 * r : 2 * r + 2, 2 * c : 2 * c + 2] = r * 4 + c
    patches = model.patchify(img)  # (1, 16, 4)
    assert torch.equal(patches[0, :, 0], torch.arange(16.0))
    logits, attn = model(torch.randn(3, 1, 8, 8), return_attn=True)
    assert logits.shape == (3, 10) and attn[0].shape == (3, 2, 17, 17)


def test_structures_2d():
    s = locality_2d(4, 4)
    assert s.shape == (4, 17, 17)
    assert (s[:, 0] == 1).all() and (s[:, :, 0] == 1).all()  # CLS unconstrained
    assert torch.equal(s[0, 1:, 1:], neighbourhood_2d(4, 1))
    o = offset_2d(4, (0, 1))
    assert (o.sum(1) == 1).all() and o[0, 1] == 1 and o[3, 3] == 1  # right neighbour, clamped at the edge
    imp = impulse_2d(4, 3)
    assert torch.equal(imp[0, 1:, 1:], torch.eye(16))


def _digits_batch(n: int = 128) -> torch.Tensor:
    data = load_digits()
    x = data.train_x[:n] / 16.0
    return (x - x.mean()) / x.std()


@pytest.mark.parametrize("method", ["default", "mimetic", "impulse", "mask"])
def test_step0_attention_pattern(method):
    """Each init's pattern is what it claims at step 0, measured on real images."""
    torch.manual_seed(0)
    x = _digits_batch()
    imp, loc = impulse_2d(4, 4), locality_2d(4, 4)
    priors = [MaskPrior(loc) for _ in range(2)] if method == "mask" else None
    model = ViT(8, 2, 1, 10, dim=32, depth=2, heads=4, priors=priors)
    if method != "mask":
        QK_INITS[method].apply(model, x, [imp] * 2)
    _, attn = model(x, return_attn=True)
    impulse_mass = np.mean([allowed_mass(a[:, :, 1:], imp[:, 1:], "all") for a in attn])
    local_mass = np.mean([allowed_mass(a[:, :, 1:], loc[:, 1:], "all") for a in attn])
    self_mass = np.mean([a[:, :, 1:, 1:].diagonal(dim1=-2, dim2=-1).mean().item() for a in attn])
    uniform_impulse = 1 / 17  # one allowed key of 17 (plus CLS)
    if method == "default":
        assert impulse_mass < 3 * uniform_impulse and self_mass < 1.5 * uniform_impulse
    elif method == "mimetic":
        assert self_mass > 2.5 * uniform_impulse  # W_Q W_K^T ~ I: tokens prefer themselves
    elif method == "impulse":
        assert impulse_mass > 0.8
    else:
        assert local_mass > 0.95


def test_mimetic_value_output_product():
    torch.manual_seed(0)
    model = ViT(8, 2, 1, 10, dim=32, depth=1, heads=4)
    QK_INITS["mimetic"].apply(model, torch.zeros(1, 1, 8, 8), [])
    attn = model.blocks[0].attn
    vo = attn.v.weight.T @ attn.out.weight.T  # (D, D): x -> x W_v^T W_o^T
    assert vo.diagonal().mean().item() == pytest.approx(-0.4, abs=0.05)


def test_missing_data_dir_cli(tmp_path):
    from masklab.cli import main

    assert (
        main(
            [
                "vision",
                "--data",
                "cifar10",
                "--data-dir",
                str(tmp_path / "none"),
                "--out",
                str(tmp_path / "o"),
                "--no-progress",
            ]
        )
        == 2
    )


@pytest.mark.slow
def test_vision_quick_cli(tmp_path):
    out = tmp_path / "vit"
    proc = subprocess.run(
        [sys.executable, "-m", "masklab", "vision", "--quick", "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads((out / "results.json").read_text())
    assert {r["method"] for r in res["runs"]} == {"default", "mimetic", "impulse", "mask"}
    by = {r["method"]: r["metrics"] for r in res["runs"]}
    assert all(m["test_acc"] > 30 for m in by.values())  # learns well above chance (10%)
    assert by["impulse"]["impulse_mass_step0"] > 0.8 > by["default"]["impulse_mass_step0"]
    assert by["mask"]["local_mass_step0"] > by["default"]["local_mass_step0"]
    for fig in ("vision_test_acc.png", "vision_attention_step0.png"):
        assert (out / fig).stat().st_size > 1000
    assert "paper: CIFAR-10" in (out / "results.md").read_text()
