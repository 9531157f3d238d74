"""OpenCV's `cv2.resize(..., interpolation=cv2.INTER_CUBIC)` on float32 images: OpenCV itself when installed, else
OpenCV's portable algorithm in numpy.

mistral-common resizes Pixtral images with `cv2.resize(np.array(rgb, dtype=np.float32), (w, h),
interpolation=cv2.INTER_CUBIC)` (`mistral_common/tokens/tokenizers/image.py`, `transform_image`). With OpenCV
installed (`ctxlock[opencv]`, any of the opencv-python wheels), the "opencv" `Resizer` makes exactly that call,
in the same process and with OpenCV's own IPP setting, so its result is mistral-common's bit for bit. Without it,
`Resizer.portable()` computes the same thing in numpy: a separable 4-tap cubic convolution with OpenCV's constant
A = -0.75, source coordinates `(dst + 0.5) * scale - 0.5` with `scale = 1 / (dst_size / src_size)` (OpenCV's own
double arithmetic), the offsets and weights rounded to float32 as OpenCV computes them, and out-of-range taps
clamped to the edge (OpenCV's replicate border). No antialiasing when shrinking, exactly as OpenCV. Two passes in
float32, each gathering whole rows (the image is transposed between them); OpenCV goes across then down, this goes
down then across: the same sums rounded in another order, within ~1e-4 of a level (1e-6 after normalization).
`tests/multimodal/test_mm_pixtral.py` holds it to OpenCV (without IPP) within 1e-5 after normalization. It is not exact
against mistral-common when OpenCV's x86 wheels route a resize through Intel IPP (whose bicubic weights are
double precision): up to `PORTABLE_MAX_DIFF` after normalization, measured; a record names which resizer ran.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

import numpy as np

__all__ = ["CUBIC_A", "OPENCV_DISTRIBUTIONS", "PORTABLE_MAX_DIFF", "Resizer", "cubic_resize", "opencv_resize"]

# The PyPI distributions that install the `cv2` module, in the order their version is looked up.
OPENCV_DISTRIBUTIONS = (
    "opencv-python-headless",
    "opencv-python",
    "opencv-contrib-python-headless",
    "opencv-contrib-python",
)
# The portable resizer against mistral-common with OpenCV's IPP on, after normalization (/255, /std): the largest
# difference measured (tests/multimodal/test_mm_pixtral.py's corpus and bench_images_families.py's 100 images: 1.14e-4),
# and the bound the tests hold it to.
PORTABLE_MAX_DIFF = 2e-4

CUBIC_A = np.float32(-0.75)


def _taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices (size_out, 4) int64, weights (size_out, 4) float32) for one axis, as OpenCV's resize computes them."""
    scale = 1.0 / (size_out / size_in)
    fx = ((np.arange(size_out, dtype=np.float64) + 0.5) * scale - 0.5).astype(np.float32)
    sx = np.floor(fx)
    x = (fx - sx).astype(np.float32)
    a = CUBIC_A
    one = np.float32(1)
    x1 = x + one
    c0 = ((a * x1 - np.float32(5) * a) * x1 + np.float32(8) * a) * x1 - np.float32(4) * a
    c1 = ((a + np.float32(2)) * x - (a + np.float32(3))) * x * x + one
    y = one - x
    c2 = ((a + np.float32(2)) * y - (a + np.float32(3))) * y * y + one
    c3 = one - c0 - c1 - c2
    weights = np.stack([c0, c1, c2, c3], axis=1).astype(np.float32)
    idx = sx.astype(np.int64)[:, None] + np.arange(-1, 3, dtype=np.int64)[None, :]
    return np.clip(idx, 0, size_in - 1), weights


def _rows(image: np.ndarray, size_out: int) -> np.ndarray:
    """One separable pass down axis 0 (whole rows are gathered: contiguous copies), float32 out; an 8-bit input is
    widened after the gather (its values are exact in float32)."""
    size_in = image.shape[0]
    if size_in == size_out:
        return image if image.dtype == np.float32 else image.astype(np.float32)
    idx, w = _taps(size_in, size_out)
    shape = (size_out,) + (1,) * (image.ndim - 1)
    out: np.ndarray = image[idx[:, 0]].astype(np.float32, copy=False)
    out *= w[:, 0].reshape(shape)
    for k in range(1, 4):
        term = image[idx[:, k]].astype(np.float32, copy=False)
        term *= w[:, k].reshape(shape)
        out += term
    return out


def cubic_resize(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """`cv2.resize(image.astype(np.float32), (width, height), interpolation=cv2.INTER_CUBIC)` for a float32 or
    uint8 (H, W, C) array, as a float32 (height, width, C) view (not C-contiguous)."""
    if image.dtype not in (np.float32, np.uint8) or image.ndim != 3:
        raise ValueError(f"cubic_resize takes a float32 or uint8 (H, W, C) array, got {image.dtype} {image.shape}")
    if width < 1 or height < 1:
        raise ValueError(f"cubic_resize to {width}x{height}: sizes must be positive")
    if (height, width) == image.shape[:2]:  # OpenCV copies an image resized to its own size
        return image.astype(np.float32)
    down = _rows(image, height)  # (height, W, C)
    across = _rows(np.ascontiguousarray(down.transpose(1, 0, 2)), width)  # (width, height, C)
    return across.transpose(1, 0, 2)


def opencv_resize(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """mistral-common's call: `cv2.resize(image as float32, (width, height), interpolation=cv2.INTER_CUBIC)`, for a
    float32 or uint8 (H, W, C) array; (height, width, C) float32. Needs OpenCV (`ctxlock[opencv]`)."""
    import cv2  # optional (ctxlock[opencv]); 0.1-0.7 s to import, so only when an image is resized

    out = cv2.resize(np.asarray(image, dtype=np.float32), (width, height), interpolation=cv2.INTER_CUBIC)
    return out.reshape(height, width, -1)


def _opencv_version() -> str | None:
    if importlib.util.find_spec("cv2") is None:
        return None
    for dist in OPENCV_DISTRIBUTIONS:
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "cv2 (distribution unknown)"


@dataclass(frozen=True)
class Resizer:
    """Which bicubic resize a Pixtral image goes through, named for records: `kind` "opencv" (OpenCV itself, exact
    against mistral-common) or "portable" (ctxlock's numpy, OpenCV's algorithm without IPP: not exact)."""

    kind: str
    version: str  # "opencv-python-headless 5.0.0.93", or "ctxlock numpy"

    @classmethod
    def detect(cls) -> Resizer:
        """OpenCV when the `cv2` module is installed (found without importing it), else the portable resizer."""
        version = _opencv_version()
        return cls.portable() if version is None else cls("opencv", version)

    @classmethod
    def portable(cls) -> Resizer:
        return cls("portable", "ctxlock numpy")

    @property
    def exact(self) -> bool:
        return self.kind == "opencv"

    def describe(self) -> str:
        if self.exact:
            return f"{self.version}: cv2.resize INTER_CUBIC on float32, as mistral-common calls it (IPP as OpenCV sets)"
        return (
            "ctxlock's numpy port of OpenCV INTER_CUBIC (A=-0.75, replicate border, float32, no IPP): not exact vs "
            f"mistral-common: max |diff| <= {PORTABLE_MAX_DIFF:g} after normalization (install ctxlock[opencv])"
        )

    def __call__(self, image: np.ndarray, width: int, height: int) -> np.ndarray:
        if self.exact:
            return opencv_resize(image, width, height)
        return cubic_resize(image, width, height)
