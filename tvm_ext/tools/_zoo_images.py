"""Seeded synthetic images normalised as a real model's own package does (docs/real-models.md).

There are no real images on this machine, so calibration and benchmark inputs are synthetic
*images*: a smooth background (a random 4x4 colour grid, bilinearly upsampled), dark or coloured
rectangles (text lines, objects), pixel noise, rounded to 8-bit pixels like a decoded image, then
normalised exactly as the model's package does (``(pixel / 255 - mean) / std``). They have the
value range and the spatial correlation of the model's real inputs, which N(0, 1) noise has not
(YOLOv8 expects [0, 1]).
"""
from __future__ import annotations

from typing import Union

import numpy as np

from ._zoo_catalogue import RealModel, variant

__all__ = ["images"]


def _upsample_bilinear(grid: np.ndarray, h: int, w: int) -> np.ndarray:
    """(C, gh, gw) -> (C, h, w), align-corners bilinear."""
    c, gh, gw = grid.shape
    ys, xs = np.linspace(0, gh - 1, h), np.linspace(0, gw - 1, w)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, gh - 1), np.minimum(x0 + 1, gw - 1)
    fy, fx = (ys - y0)[None, :, None], (xs - x0)[None, None, :]
    top = grid[:, y0][:, :, x0] * (1 - fx) + grid[:, y0][:, :, x1] * fx
    bot = grid[:, y1][:, :, x0] * (1 - fx) + grid[:, y1][:, :, x1] * fx
    return top * (1 - fy) + bot * fy


def _pixels(rng: np.random.Generator, c: int, h: int, w: int) -> np.ndarray:
    """One synthetic 8-bit image (C, H, W) as float: background, rectangles, noise."""
    img = _upsample_bilinear(rng.uniform(40, 230, (c, 4, 4)), h, w)
    for _ in range(int(rng.integers(3, 12))):
        rh = int(rng.integers(max(2, h // 16), max(3, h // 2)))
        rw = int(rng.integers(max(2, w // 16), max(3, w // 2)))
        y, x = int(rng.integers(0, h - rh + 1)), int(rng.integers(0, w - rw + 1))
        colour = rng.uniform(0, 255, (c, 1, 1)) if rng.random() < 0.5 else rng.uniform(0, 60, (c, 1, 1))
        img[:, y:y + rh, x:x + rw] = colour
    img += rng.normal(0.0, 6.0, img.shape)
    return np.clip(np.rint(img), 0, 255)


def images(model: Union[str, RealModel], n: int, seed: int = 0) -> list:
    """``n`` seeded synthetic images normalised as the model's package does (see module note).

    Parameters
    ----------
    model : str or RealModel
        Any catalogue name (quantized variants use their fp32 model's input) or entry.
    n : int
        Number of images.
    seed : int, optional
        Image ``i`` comes from ``np.random.default_rng([seed, i])``.

    Returns
    -------
    list of numpy.ndarray
        float32 arrays of shape ``model.input_shape``.
    """
    if isinstance(model, str):
        model = variant(model).model
    b, c, h, w = model.input_shape
    mean = np.asarray(model.mean, np.float64)[:, None, None]
    std = np.asarray(model.std, np.float64)[:, None, None]
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        batch = np.stack([(_pixels(rng, c, h, w) / 255.0 - mean) / std for _ in range(b)])
        out.append(batch.astype(np.float32))
    return out
