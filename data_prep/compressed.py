"""Compressed inputs read as a stream: gzip and zstd (any number of frames), and the exceptions
that mean a file was cut short or is corrupt (data_prep.inputs counts that as one bad record)."""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path
from typing import IO

#: Suffix -> compression of the input files data_prep reads.
COMPRESSED = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


class _DamagedStream(Exception):
    """Compressed data that cannot be decoded (raised by the zstd reader)."""


# What a cut-short or corrupt .gz/.zst raises while it is read (gzip: EOFError, BadGzipFile for a
# bad header/CRC/length, zlib.error for bad deflate data; zstd: EOFError, _DamagedStream).
STREAM_DAMAGE = (EOFError, zlib.error, gzip.BadGzipFile, _DamagedStream)


class _ZstdRaw(io.RawIOBase):
    """Streaming zstd decompression (any number of frames) that reports a truncated file;
    zstandard's stream_reader ends silently in the middle of a frame."""

    def __init__(self, path: Path):
        # Lazy: zstandard only for .zst inputs; data_prep's --help does without it.
        import zstandard

        self._zstd = zstandard
        self._src = open(path, "rb")
        self._new_frame()
        self._pending = b""
        self._pos = 0  # read position in _pending (no re-slicing of big buffers)

    def _new_frame(self) -> None:
        self._dobj = self._zstd.ZstdDecompressor().decompressobj()
        self._in_frame = False

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while self._pos >= len(self._pending):
            self._pending, self._pos = b"", 0
            chunk = self._src.read(1 << 20)
            if not chunk:
                if self._in_frame:
                    raise EOFError("compressed stream ends in the middle of a zstd frame")
                return 0
            try:
                while chunk:
                    self._in_frame = True
                    self._pending += self._dobj.decompress(chunk)
                    chunk = b""
                    if self._dobj.eof:  # frame complete; the rest is the next frame
                        chunk = self._dobj.unused_data
                        self._new_frame()
            except self._zstd.ZstdError as e:
                raise _DamagedStream(f"zstd: {e}") from e
        n = min(len(buf), len(self._pending) - self._pos)
        buf[:n] = memoryview(self._pending)[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._src.close()
        super().close()


def open_binary(path: Path, compression: str | None) -> IO[bytes]:
    """The file's bytes, decompressed when ``compression`` is "gzip" or "zstd"."""
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "zstd":
        return io.BufferedReader(_ZstdRaw(path), buffer_size=1 << 20)
    return open(path, "rb", buffering=1 << 20)
