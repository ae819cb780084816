#!/bin/sh
# Which Python the venv is made with (make install runs it before anything
# else, so that a machine without a supported Python stops in seconds, with
# what to install, instead of failing inside a package's build later).
#
#   sh tools/python.sh venv VENV PYTHON ORIGIN
#       makes VENV if it is missing, with PYTHON where the user named one
#       (ORIGIN is make's $(origin PYTHON): "file" is the Makefile's default),
#       else with python3 if tmpi supports it, else with the newest supported
#       python3.X found; says which it took.  An existing VENV is checked: a
#       supported Python, and the one PYTHON= names.
#   sh tools/python.sh choose PYTHON ORIGIN
#       prints the interpreter `venv` would take, and makes nothing.
#   sh tools/python.sh find X.Y
#       prints a Python X.Y interpreter found here, or exits 1 (.ci/run runs
#       the suite on each supported Python it finds).
#
# An interpreter counts once it runs: a pyenv shim of a version that is
# installed but not selected (pyenv global/local) answers "command not
# found", so pyenv is asked where that version lives (`pyenv whence`).
# Only shell built-ins are used, so that tests can run it with a PATH of
# fake interpreters alone.

# Newest first.  setup.py's python_requires says the same (a test checks).
SUPPORTED="3.12 3.11"
SUPPORTED_WORDS="3.11 and 3.12"

say() { printf '%s\n' "$*" >&2; }

# probe CMD: "X.Y X.Y.Z EXECUTABLE" of the interpreter CMD runs, or fails.
probe() {
    "$1" -c 'import sys; v = sys.version_info; print("%d.%d %d.%d.%d %s" % (v[0], v[1], v[0], v[1], v[2], sys.executable))' 2>/dev/null
}

# resolve CMD: sets FOUND_MINOR, FOUND_VERSION, FOUND_PATH for CMD, asking
# pyenv for a bare name whose shim does not run; fails if nothing runs.
resolve() {
    FOUND_MINOR= FOUND_VERSION= FOUND_PATH=
    _line=$(probe "$1")
    if [ -z "$_line" ]; then
        case "$1" in
            */*) return 1 ;;
        esac
        command -v pyenv >/dev/null 2>&1 || return 1
        _last=
        for _v in $(pyenv whence "$1" 2>/dev/null); do _last=$_v; done
        [ -n "$_last" ] || return 1
        _prefix=$(pyenv prefix "$_last" 2>/dev/null) || return 1
        _line=$(probe "$_prefix/bin/$1")
        [ -n "$_line" ] || return 1
    fi
    set -- $_line
    FOUND_MINOR=$1 FOUND_VERSION=$2
    shift 2
    FOUND_PATH=$*
}

supported() {
    for _s in $SUPPORTED; do
        [ "$1" = "$_s" ] && return 0
    done
    return 1
}

# why X.Y: one line on why tmpi does not run there.
why() {
    case "$1" in
        3.1[3-9]|3.[2-9][0-9]|[4-9].*)
            say "Theano 1.0.5, which tmpi distributes, compiles its C code against numpy 1.x, and"
            say "Python $1 has only numpy 2 (numpy 1.26, the last 1.x, stops at Python 3.12)." ;;
        *)
            say "Older Pythons are not supported: tmpi's shims and pins are verified on $SUPPORTED_WORDS." ;;
    esac
}

how_to_get_one() {
    say "Get Python 3.12 (or 3.11) one of these ways, then run make again (it looks for python3.12"
    say "and python3.11 on PATH and in pyenv), or name one: make demo PYTHON=/path/to/python3.12"
    say "  your distribution:  apt install python3.12-venv (Ubuntu 24.04), dnf install python3.12 (Fedora, RHEL 9);"
    say "                      Debian 12's python3 is 3.11: apt install python3-venv"
    say "  pyenv:              pyenv install 3.12  (make finds it without pyenv global)"
    say "  conda:              conda create -n py312 python=3.12, then make demo PYTHON=\$(conda run -n py312 which python)"
    say "  uv:                 uv python install 3.12, then make demo PYTHON=\$(uv python find 3.12)"
}

# others: the supported pythonX.Y found here, as "pythonX.Y (Python X.Y.Z)".
others() {
    _list=
    for _s in $SUPPORTED; do
        if resolve "python$_s" && [ "$FOUND_MINOR" = "$_s" ]; then
            _list="$_list${_list:+, }python$_s (Python $FOUND_VERSION, $FOUND_PATH)"
        fi
    done
    printf '%s' "$_list"
}

# choose PYTHON ORIGIN: sets CHOSEN to the interpreter's path, or exits 2.
choose() {
    if [ "$2" != file ] && [ "$2" != undefined ]; then
        if ! resolve "$1"; then
            say "make: PYTHON=$1 does not run here (not found, or not a Python)."
            _o=$(others)
            [ -n "$_o" ] && say "Found here: $_o." || how_to_get_one
            exit 2
        fi
        if ! supported "$FOUND_MINOR"; then
            _asked=$FOUND_MINOR _asked_version=$FOUND_VERSION
            say "make: PYTHON=$1 is Python $_asked_version; tmpi runs on Python $SUPPORTED_WORDS."
            why "$_asked"
            _o=$(others)
            if [ -n "$_o" ]; then
                say "Found here: $_o: run make again with PYTHON= one of them."
            else
                how_to_get_one
            fi
            exit 2
        fi
        CHOSEN=$FOUND_PATH
        say "make: using PYTHON=$1 (Python $FOUND_VERSION, $FOUND_PATH)"
        return
    fi
    if resolve "$1" && supported "$FOUND_MINOR"; then
        CHOSEN=$FOUND_PATH
        say "make: using $1 (Python $FOUND_VERSION, $FOUND_PATH)"
        return
    fi
    if [ -n "$FOUND_MINOR" ]; then
        _default="$1 is Python $FOUND_VERSION, which tmpi does not run on" _default_minor=$FOUND_MINOR
    else
        _default="there is no $1 here" _default_minor=
    fi
    for _s in $SUPPORTED; do
        if resolve "python$_s" && [ "$FOUND_MINOR" = "$_s" ]; then
            CHOSEN=$FOUND_PATH
            say "make: $_default; using python$_s instead (Python $FOUND_VERSION, $FOUND_PATH)"
            return
        fi
    done
    say "make: $_default, and no python3.12 or python3.11 was found (on PATH, or installed by pyenv)."
    [ -n "$_default_minor" ] && why "$_default_minor"
    how_to_get_one
    exit 2
}

case "$1" in
    choose)
        choose "$2" "$3"
        printf '%s\n' "$CHOSEN" ;;
    find)
        resolve "python$2" && [ "$FOUND_MINOR" = "$2" ] || exit 1
        printf '%s\n' "$FOUND_PATH" ;;
    venv)
        venv=$2
        if [ -x "$venv/bin/python" ]; then
            if ! resolve "$venv/bin/python"; then
                say "make: $venv/bin/python does not run (was the Python it was made with removed?): rm -rf $venv, then make again."
                exit 2
            fi
            have=$FOUND_MINOR have_version=$FOUND_VERSION
            if ! supported "$have"; then
                say "make: $venv is Python $have_version; tmpi runs on Python $SUPPORTED_WORDS."
                why "$have"
                say "rm -rf $venv (or make clean), then make again: make takes a supported Python."
                exit 2
            fi
            if [ "$4" != file ] && [ "$4" != undefined ]; then
                resolve "$3" || { say "make: PYTHON=$3 does not run here (not found, or not a Python)."; exit 2; }
                if [ "$FOUND_MINOR" != "$have" ]; then
                    say "make: $venv was made with Python $have_version, and PYTHON=$3 is Python $FOUND_VERSION."
                    say "Give it a venv of its own: make ... PYTHON=$3 VENV=.venv${FOUND_MINOR%%.*}${FOUND_MINOR#*.} (or rm -rf $venv first)."
                    exit 2
                fi
            fi
            exit 0
        fi
        choose "$3" "$4"
        "$CHOSEN" -m venv "$venv" ;;
    *)
        say "usage: sh tools/python.sh venv VENV PYTHON ORIGIN | choose PYTHON ORIGIN | find X.Y"
        exit 2 ;;
esac
