"""The commands the README, docs/ and the plugins' and examples' READMEs show
are commands tmpi takes: read with tmpi's own parser, tmpi's options before
the script, nothing of tmpi's handed to the script by mistake."""
import re
import shlex

import pytest

from conftest import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / "plugins").glob("*/README.md"), *(ROOT / "examples").glob("*/README.md")])

#: Options only tmpi has: after the script they would be the script's, which
#: is never what a page means.
TMPI_ONLY = {"--framework", "--rule", "--rule-option", "--scaling", "--lr-scaling",
             "--warmup-steps", "--exchanger", "--precision", "--overlap", "--bucket-bytes",
             "--loss-reduction", "--outputs", "--stall-timeout", "--start-timeout",
             "--on-stall", "--all-ranks-output", "--compile-dirs", "--threads-per-rank",
             "--oversubscribe", "--mpiexec", "--mpiexec-arg", "--checkpoint-dir",
             "--checkpoint-every", "--checkpoint-keep", "--resume", "--allow-new-arguments",
             "--nonfinite", "--max-restarts", "--min-ranks", "--record", "--progress",
             "--no-summary", "--require-device"}


def wrap_commands():
    """``(page, line number, words after "tmpi wrap")`` of every concrete command."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in re.finditer(r"(?:^|`|\$ )\s*tmpi wrap ([^`#]*)", line):
                text = match.group(1).strip().rstrip("\\").strip()
                # Usage lines with placeholders, and prose naming an option, are not commands.
                if re.search(r"\[|\]|\.\.\.|\b[A-Z]{2,}\b(?!\.)", text):
                    continue
                words = shlex.split(text)
                if any(w.isalpha() and w.isupper() for w in words):
                    continue  # a placeholder (-n N)
                if any(w.endswith(".py") or w == "-m" for w in words):
                    found.append((page.relative_to(ROOT), number, words))
    return found


COMMANDS = wrap_commands()


def test_the_pages_show_commands():
    assert len(COMMANDS) > 30, COMMANDS  # the reader below finds them


@pytest.mark.parametrize("page, number, words", COMMANDS,
                         ids=["%s:%d" % (page, number) for page, number, _ in COMMANDS])
def test_a_command_shown_is_one_tmpi_takes(page, number, words):
    from tmpi_adapters.launch.arguments import split_wrap_argv, wrap_parser
    parser = wrap_parser()
    ours, target, rest = split_wrap_argv(words, parser)
    assert target is not None, "%s:%d: no script in tmpi wrap %s" % (page, number, words)
    try:
        parser.parse_args(ours)
    except SystemExit:
        pytest.fail("%s:%d: tmpi wrap refuses its options %s" % (page, number, ours))
    misplaced = [w for w in rest if w.split("=", 1)[0] in TMPI_ONLY]
    assert not misplaced, ("%s:%d: %s come after the script, which makes them the "
                           "script's arguments" % (page, number, misplaced))
