"""Install Theano 1.0.5 from its sdist into this interpreter's environment,
on Python 3.12 and later: ``python tools/install_theano.py [pip options]``.

Theano 1.0.5 is published as an sdist only, and its ``setup.py`` reads
``setup.cfg`` through the ``versioneer.py`` it ships, which calls
``configparser.SafeConfigParser`` and ``readfp``: both were removed in Python
3.12, so pip stops inside Theano's setup with an ``AttributeError``, even for
``pip download`` (pip runs the setup to read the version).  This runs pip with
those two names restored in pip's build process (a ``sitecustomize`` module on
``PYTHONPATH``, seen only by that process and the setup it runs) and without
build isolation (which would drop ``PYTHONPATH``); the sdist itself is
unchanged, and what is installed is Theano as published.

Extra arguments go to pip (``make install`` passes ``-c constraints.txt``).
On Python 3.11 and older nothing is needed and nothing is done: pip installs
Theano as any other requirement.
"""
import os
import subprocess
import sys
import tempfile

THEANO = "theano==1.0.5"

#: Restores, in the process that builds Theano, the two names its
#: versioneer.py calls (SafeConfigParser became ConfigParser in 3.2, readfp
#: read_file; 3.12 removed the old names).
SITECUSTOMIZE = """\
import configparser
configparser.SafeConfigParser = configparser.ConfigParser
if not hasattr(configparser.RawConfigParser, "readfp"):
    configparser.RawConfigParser.readfp = configparser.RawConfigParser.read_file
"""


def pip(*args, env=None):
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"] + list(args)
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, env=env)


def main(pip_options):
    if sys.version_info < (3, 12):
        return 0  # pip installs Theano as any other requirement there
    # Without build isolation, the build's own requirements come from this
    # environment: setuptools (which 3.12's venv no longer brings) and wheel.
    pip(*pip_options, "setuptools>=60,<80", "wheel")
    with tempfile.TemporaryDirectory(prefix="tmpi-theano-build-") as shims:
        with open(os.path.join(shims, "sitecustomize.py"), "w") as handle:
            handle.write(SITECUSTOMIZE)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [shims] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        pip("--no-build-isolation", *pip_options, THEANO, env=env)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except subprocess.CalledProcessError as error:
        sys.exit("install_theano: pip failed (exit status %d); its messages are above. "
                 "Theano's sdist is pure Python, so the cause is most often the package "
                 "index being out of reach or a constraint no release meets"
                 % error.returncode)
