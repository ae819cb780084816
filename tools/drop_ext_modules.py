"""Remove the ``ext_modules=...`` argument of the ``setup()`` call in a
``setup.py``, in place: ``python tools/drop_ext_modules.py path/to/setup.py``.

``make blocks`` runs it on Fuel 0.2.0's ``setup.py``, whose Cython extension
(``fuel/transformers/_image.c``) does not build on Python 3.11 and which runs
without it.  The argument is found with :mod:`ast` and cut out whole, from its
name to the end of its value and a comma after it, however many lines it
spans: removing its lines by hand leaves brackets behind, and pip then fails
on the ``setup.py`` with "unmatched ']'".
"""
import ast
import sys


def offset(text, line, column):
    """Index in ``text`` of ``ast``'s 1-based ``line`` and ``column``
    (a column counts UTF-8 bytes)."""
    lines = text.splitlines(keepends=True)
    start = sum(len(piece) for piece in lines[:line - 1])
    return start + len(lines[line - 1].encode("utf-8")[:column].decode("utf-8"))


def without_ext_modules(text, path="setup.py"):
    """``text`` (a ``setup.py``) less every ``ext_modules=`` keyword argument;
    a ``ValueError`` when there is none."""
    found = [keyword for node in ast.walk(ast.parse(text, path)) if isinstance(node, ast.Call)
             for keyword in node.keywords if keyword.arg == "ext_modules"]
    if not found:
        raise ValueError("%s passes no ext_modules argument: nothing to drop (is it the "
                         "setup.py of the version the Makefile names?)" % path)
    # The last first, so that the offsets of the others still hold.
    for keyword in sorted(found, key=lambda k: (k.lineno, k.col_offset), reverse=True):
        start = offset(text, keyword.lineno, keyword.col_offset)
        end = offset(text, keyword.end_lineno, keyword.end_col_offset)
        rest = text[end:]
        after = len(rest) - len(rest.lstrip())
        if rest[after:after + 1] == ",":
            end += after + 1
        # A line the argument had to itself goes with it.
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        line_end = len(text) if line_end < 0 else line_end + 1
        if not text[line_start:start].strip() and not text[end:line_end].strip():
            start, end = line_start, line_end
        text = text[:start] + text[end:]
    compile(text, path, "exec")  # the edit left a setup.py Python reads
    return text


def main(argv):
    if len(argv) != 1:
        sys.exit("usage: python tools/drop_ext_modules.py path/to/setup.py")
    path = argv[0]
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        edited = without_ext_modules(text, path)
    except (ValueError, SyntaxError) as problem:
        sys.exit("drop_ext_modules: %s" % problem)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(edited)


if __name__ == "__main__":
    main(sys.argv[1:])
