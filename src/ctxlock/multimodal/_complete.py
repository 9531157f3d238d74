"""Whether an image file is whole, from its container alone (no pixel decoded): one rule for the header-only path
(`count`, the budget) and the decode (`render`), so that a truncated file is refused by both, at the same place.

Each format is walked by its own structure, as its specification lays it out:

- PNG (https://www.w3.org/TR/png-3/#5Chunk-layout): every chunk inside the file with a matching CRC-32, IHDR
  first, at least one IDAT, IEND; the IDAT stream inflated to its end (the output discarded, so no memory grows).
- JPEG (ITU-T T.81, Annex B): marker segments by their lengths, entropy-coded data scanned to the next marker,
  up to EOI.
- GIF (https://www.w3.org/Graphics/GIF/spec-gif89a.txt): the blocks and their sub-blocks, up to the trailer.
- WebP (RIFF): the RIFF size inside the file. BMP: the pixel array inside the file. TIFF: every strip and tile
  inside the file (from the tags Pillow read), a deflate strip inflated to its end.

What the container cannot show is found by the decode alone: a JPEG's corrupt entropy-coded data (its bytes
flipped, not cut), an LZW or PackBits TIFF's, a GIF's LZW codes, a lossy WebP's VP8 data (docs/images.md).
"""

from __future__ import annotations

import struct
import zlib

from PIL import Image

from ctxlock.errors import ImageDecodeError


class _Short(Exception):
    """The structure runs past the end of the bytes, or breaks its own rules."""


def _png(data: bytes) -> None:
    pos, first, idat, inflater = 8, True, False, zlib.decompressobj()
    while True:
        if pos + 12 > len(data):
            raise _Short(f"the chunk at byte {pos} runs past the end ({len(data)} bytes)")
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > len(data):
            raise _Short(f"the {kind.decode('latin-1')!r} chunk at byte {pos} runs past the end ({len(data)} bytes)")
        body = data[pos + 8 : pos + 8 + length]
        if zlib.crc32(kind + body) != struct.unpack_from(">I", data, end - 4)[0]:
            raise _Short(f"the {kind.decode('latin-1')!r} chunk at byte {pos} fails its CRC")
        if first and kind != b"IHDR":
            raise _Short("the first chunk is not IHDR")
        first = False
        if kind == b"IDAT":
            idat = True
            try:
                while body:  # the output discarded as it comes: no memory grows
                    inflater.decompress(body, 1 << 16)
                    body = inflater.unconsumed_tail
            except zlib.error as e:
                raise _Short(f"the image data at byte {pos} does not inflate: {e}") from None
        if kind == b"IEND":
            break
        pos = end
    if not idat or not inflater.eof:
        raise _Short("the image data ends before its deflate stream does")


_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM and RSTn: markers without a length


def _jpeg(data: bytes) -> None:
    pos = 2
    while True:
        while pos < len(data) and data[pos] == 0xFF and pos + 1 < len(data) and data[pos + 1] == 0xFF:
            pos += 1  # fill bytes
        if pos + 2 > len(data) or data[pos] != 0xFF:
            raise _Short(f"no marker at byte {pos} ({len(data)} bytes)")
        marker = data[pos + 1]
        if marker == 0xD9:
            return
        if marker in _STANDALONE:
            pos += 2
            continue
        if pos + 4 > len(data):
            raise _Short(f"the segment at byte {pos} runs past the end")
        pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
        if pos > len(data):
            raise _Short(f"the segment ending at byte {pos} runs past the end ({len(data)} bytes)")
        if marker == 0xDA:  # start of scan: entropy-coded data up to the next marker other than RSTn
            while True:
                at = data.find(b"\xff", pos)
                if at < 0 or at + 1 >= len(data):
                    raise _Short("the scan data runs to the end without EOI")
                if data[at + 1] == 0 or data[at + 1] in _STANDALONE or data[at + 1] == 0xFF:
                    pos = at + 2 if data[at + 1] != 0xFF else at + 1
                    continue
                pos = at
                break


def _sub_blocks(data: bytes, pos: int) -> int:
    while True:
        if pos >= len(data):
            raise _Short("a data sub-block runs past the end")
        size = data[pos]
        pos += 1 + size
        if size == 0:
            return pos


def _gif(data: bytes) -> None:
    if len(data) < 13:
        raise _Short("the logical screen descriptor runs past the end")
    flags = data[10]
    pos = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
    while True:
        if pos >= len(data):
            raise _Short(f"the block at byte {pos} runs past the end ({len(data)} bytes)")
        kind = data[pos]
        if kind == 0x3B:
            return
        if kind == 0x21:
            pos = _sub_blocks(data, pos + 2)
        elif kind == 0x2C:
            if pos + 10 > len(data):
                raise _Short(f"the image descriptor at byte {pos} runs past the end")
            local = data[pos + 9]
            pos += 10 + (3 * 2 ** ((local & 7) + 1) if local & 0x80 else 0) + 1  # + the LZW minimum code size
            pos = _sub_blocks(data, pos)
        else:
            raise _Short(f"an unknown block 0x{kind:02x} at byte {pos}")


def _webp(data: bytes) -> None:
    size = 8 + struct.unpack_from("<I", data, 4)[0]
    if size > len(data):
        raise _Short(f"the RIFF container declares {size} bytes; the file has {len(data)}")


def _bmp(im: Image.Image, data: bytes) -> None:
    offset = struct.unpack_from("<I", data, 10)[0] if len(data) >= 14 else len(data) + 1
    stride = ((im.width * _bmp_bits(im, data) + 31) // 32) * 4
    compression = struct.unpack_from("<I", data, 30)[0] if len(data) >= 34 else 0
    need = offset + (stride * im.height if compression in (0, 3, 6) else 1)
    if need > len(data):
        raise _Short(f"the pixel array needs {need} bytes; the file has {len(data)}")


def _bmp_bits(im: Image.Image, data: bytes) -> int:
    return struct.unpack_from("<H", data, 28)[0] if len(data) >= 30 else 24


def _tiff(im: Image.Image, data: bytes) -> None:
    tags = getattr(im, "tag_v2", {})
    for offsets_tag, counts_tag in ((273, 279), (324, 325)):
        offsets, counts = tags.get(offsets_tag), tags.get(counts_tag)
        if offsets is None:
            continue
        offsets = offsets if isinstance(offsets, tuple) else (offsets,)
        counts = counts if isinstance(counts, tuple) else (counts,)
        for o, c in zip(offsets, counts, strict=False):
            if o + c > len(data):
                raise _Short(f"a strip at byte {o} of {c} bytes runs past the end ({len(data)} bytes)")
            if tags.get(259) in (8, 32946):  # Adobe deflate: each strip one zlib stream, inflated to its end
                _inflates(data[o : o + c], o)


def _inflates(stream: bytes, at: int) -> None:
    inflater = zlib.decompressobj()
    try:
        while stream:
            inflater.decompress(stream, 1 << 16)
            stream = inflater.unconsumed_tail
    except zlib.error as e:
        raise _Short(f"the deflate data at byte {at} does not inflate: {e}") from None
    if not inflater.eof:
        raise _Short(f"the deflate data at byte {at} ends before its stream does")


def check_complete(im: Image.Image, data: bytes, fmt: str, path: str | None) -> None:
    """`ImageDecodeError` when the file's container says it is cut short (or, for PNG, corrupt)."""
    try:
        if fmt == "PNG":
            _png(data)
        elif fmt == "JPEG":
            _jpeg(data)
        elif fmt == "GIF":
            _gif(data)
        elif fmt == "WEBP":
            _webp(data)
        elif fmt == "BMP":
            _bmp(im, data)
        elif fmt == "TIFF":
            _tiff(im, data)
    except (_Short, struct.error) as e:
        raise ImageDecodeError(
            f"the {fmt} file is truncated or corrupt: {e}",
            path=path,
            hint="send the whole file; nothing was decoded",
        ) from None
