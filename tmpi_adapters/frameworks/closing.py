"""The file objects :mod:`tmpi_adapters.frameworks.writes` hands a script:
what ``open`` builds for a write-only mode, on a raw file that tells the rule
when it is closed."""
import io
import os


class ClosingFileIO(io.FileIO):
    """A raw file that calls ``on_close`` once, after it is closed."""

    _tmpi_on_close = None

    def close(self):
        on_close, self._tmpi_on_close = self._tmpi_on_close, None
        try:
            super().close()
        finally:
            if on_close is not None:
                on_close()


def layered(file, mode, buffering, encoding, errors, newline, opener, on_close, name=None):
    """What ``open`` builds for a write-only ``mode`` (as in ``_pyio.open``),
    on a raw file that calls ``on_close`` when it is closed."""
    raw = ClosingFileIO(file, mode.replace("b", "").replace("t", ""), opener=opener)
    raw._tmpi_on_close = on_close
    try:
        if name is not None:
            raw.name = name
        binary = "b" in mode
        line_buffering = False
        if buffering == 1 or buffering < 0 and raw.isatty():
            buffering, line_buffering = -1, not binary
        if buffering < 0:
            buffering = io.DEFAULT_BUFFER_SIZE
            try:
                size = os.fstat(raw.fileno()).st_blksize
                buffering = size if size > 1 else buffering
            except (OSError, AttributeError):
                pass
        if buffering == 0:
            if binary:
                return raw
            raise ValueError("can't have unbuffered text I/O")
        buffer = io.BufferedWriter(raw, buffering)
        if binary:
            return buffer
        text = io.TextIOWrapper(buffer, encoding, errors, newline, line_buffering)
        text.mode = mode
        return text
    except BaseException:
        raw._tmpi_on_close = None
        raw.close()
        raise
