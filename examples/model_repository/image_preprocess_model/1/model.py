"""Decode RAW_IMAGE bytes into the normalized [3, 224, 224] FP32 tensor of an image encoder.

Each RAW_IMAGE element is either
- an encoded PNG or JPEG (told by its magic bytes), decoded with Pillow and resized
  bilinearly; Pillow must be installed for these, or
- raw RGB pixels: exactly 3 * S * S bytes of an S x S image, row-major, channels last,
  resized by nearest-neighbour sampling with numpy alone (no dependency, deterministic).
Pixels are scaled to [0, 1], normalized with the ImageNet mean and standard deviation and
laid out channels first. A malformed element fails its request, not the batch.
"""
import functools
import io
import math

import numpy as np
import triton_python_backend_utils as pb_utils

SIZE = 224
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
# Per channel, the normalized value of each of the 256 pixel values: one lookup per pixel.
TABLE = ((np.arange(256, dtype=np.float32)[None, :] / 255.0 - MEAN[:, None]) / STD[:, None]).astype(np.float32)
ENCODED = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


def decode(data: bytes) -> np.ndarray:
    """An encoded or raw RGB image as uint8 [SIZE, SIZE, 3]."""
    if data.startswith(ENCODED):
        try:
            from PIL import Image
        except ImportError:
            raise ValueError("PNG/JPEG input needs Pillow, which is not installed; send raw RGB bytes") from None
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR))
    side = math.isqrt(len(data) // 3)
    if len(data) == 0 or 3 * side * side != len(data):
        raise ValueError(f"{len(data)} bytes is neither PNG, JPEG nor raw RGB of a square image (3*S*S bytes)")
    pixels = np.frombuffer(data, dtype=np.uint8).reshape(side * side, 3)
    return np.take(pixels, sample_index(side), axis=0).reshape(SIZE, SIZE, 3)


@functools.lru_cache(maxsize=16)
def sample_index(side: int) -> np.ndarray:
    """Flat pixel index of each output pixel: nearest-neighbour sampling of a side x side image."""
    index = np.arange(SIZE) * side // SIZE
    return (index[:, None] * side + index[None, :]).ravel()


def normalize(rgb: np.ndarray, out: np.ndarray) -> None:
    """(pixel / 255 - mean) / std per channel, written channels first into `out` [3, SIZE, SIZE]."""
    for c in range(3):
        np.take(TABLE[c], rgb[:, :, c], out=out[c])


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW_IMAGE").as_numpy().reshape(-1)
            images = np.empty((raw.shape[0], 3, SIZE, SIZE), dtype=np.float32)
            try:
                for item, out in zip(raw, images):
                    normalize(decode(item), out)
            except ValueError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"RAW_IMAGE: {e}")))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("IMAGE", images)]))
        return responses
