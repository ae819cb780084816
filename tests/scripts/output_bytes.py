"""Writes every byte value through sys.stdout.buffer, for --all-ranks-output
to relay unchanged: each value on a line of its own, Latin-1 text, a
progress bar's carriage returns, a binary dump, pieces of a line written
one by one, bytes below Python (os.write on descriptor 1), and a last line
left unfinished.  ``payload(rank)`` is what rank ``rank`` writes to stdout,
in the order written, and ``stderr_line(rank)`` its one line on stderr."""
import os
import sys


def pieces(rank):
    """The writes of rank ``rank`` to stdout: ``(how, bytes)``, in order."""
    yield "buffer", b"".join(bytes([value]) + b"\n" for value in range(256))
    yield "buffer", ("caf\u00e9 \u00fcber rank %d\n" % rank).encode("latin-1")
    yield "buffer", b"\r 10%\r 50%\r100% \x1b[K done\n"
    # A line in pieces, none of which ends it (each flushed), then its end.
    yield "buffer", bytes(range(0x80, 0x100))
    yield "buffer", b"\xff\xfe\x00 rank %d" % rank
    yield "buffer", bytes(range(0, 10)) + b"\n"
    yield "buffer", bytes(range(256)) * 3 + b"\n"  # a binary dump: \n bytes split it
    yield "text", b"text between bytes, rank %d\n" % rank
    yield "fd", b"\xe9\xe8 below Python, rank %d\n" % rank
    yield "buffer", b"\x80\x81 left unfinished, rank %d" % rank  # tmpi ends this line


def payload(rank):
    return b"".join(data for _, data in pieces(rank))


def stderr_line(rank):
    return b"\xe9 \xff on stderr, rank %d\n" % rank


if __name__ == "__main__":
    rank = int(os.environ.get("PMI_RANK", "0"))
    for how, data in pieces(rank):
        if how == "buffer":
            sys.stdout.buffer.write(data)
        elif how == "text":
            sys.stdout.write(data.decode("ascii"))
        else:
            os.write(1, data)
        sys.stdout.flush()
    sys.stderr.buffer.write(stderr_line(rank))
    sys.stderr.flush()
