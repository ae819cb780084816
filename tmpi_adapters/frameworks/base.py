"""What every framework adapter is: something that hooks a framework while a
user's script runs, and hands tmpi :class:`~tmpi_adapters.protocol.ModelProtocol` s."""
import re


class Patcher:
    """Replaces attributes and puts the originals back on :meth:`restore`."""

    def __init__(self):
        self._saved = []

    def patch(self, owner, name, value):
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, value)
        return original

    def restore(self):
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)


def imports_module(source, module):
    """True when ``source`` has ``import module`` or ``from module ... import``."""
    pattern = r"^\s*(?:import\s+%s\b|from\s+%s(?:\.\w+)*\s+import\b)" % (
        re.escape(module), re.escape(module))
    return re.search(pattern, source, re.MULTILINE) is not None


class FrameworkAdapter:
    """Base class of framework adapters.

    Parameters
    ----------
    session : tmpi_adapters.session.Session
    """

    #: the name users pass to ``--framework``
    name = None

    def __init__(self, session):
        self.session = session
        self.patcher = Patcher()

    def install(self):
        """Hook the framework; called on every rank before the user's code runs."""

    def uninstall(self):
        """Undo :meth:`install`."""
        self.patcher.restore()

    def flush(self):
        """Finish work held back between steps (weak scaling's pending group)."""

    def check_finished(self):
        """Called when the user's code returned without error; raise
        :class:`~tmpi_adapters.errors.TmpiError` if nothing was distributed."""

    def rebind(self, namespace):
        """Point names in a module namespace (a decorated script's globals) that
        were imported before :meth:`install` at the hooked versions."""
