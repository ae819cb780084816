"""Device arrays through a host exchanger: one fused copy each way per step.

On a GPU (or Theano's OpenCL device) a training step's gradients are
``pygpu`` arrays in device memory.  MPI moves host memory, so the step's
exchange goes:

1. every device array of one dtype is copied into one device buffer, back to
   back (copies on the device);
2. that buffer is read into one host buffer: **one** device-to-host copy per
   dtype, never one per parameter;
3. the host exchanger reduces views of the host buffer as it reduces numpy
   gradients (fused, weighted, fp16/bf16 on the wire, ``--overlap``'s parts);
4. the results are written into one host buffer and that buffer to one
   device buffer: **one** host-to-device copy per dtype; the step's updates
   read views of it.

Host arrays among them (a step's losses and metrics, which Theano computes on
the host) pass through untouched.  The buffers are kept per array signature
and reused: the device results are *borrowed* (valid until the next step),
as the host exchanger's are.

``pygpu`` is imported only when a device array is seen: nothing here costs
anything on the CPU.
"""
import numpy as np

from tmpi_adapters.process.devices import is_device_array


class _Group:
    """The device arrays of one dtype and context: where each one lies in the
    fused buffers, and the buffers."""

    def __init__(self, context, dtype, members):
        from pygpu import gpuarray
        self.context, self.dtype = context, np.dtype(dtype)
        self.members = []           # (position, offset, size, shape)
        offset = 0
        for position, shape in members:
            size = int(np.prod(shape, dtype=np.int64))
            self.members.append((position, offset, size, tuple(shape)))
            offset += size
        self.n = offset
        self.host = np.empty(max(self.n, 1), dtype=self.dtype)[:self.n]
        self.packed = gpuarray.empty((max(self.n, 1),), dtype=self.dtype, context=context)
        self.results = None

    def to_host(self, arrays, found):
        """Pack ``arrays``' members on the device, read them in one copy, and
        put host views of them in ``found``."""
        for position, offset, size, _ in self.members:
            if size:
                self.packed[offset:offset + size] = arrays[position].reshape((size,))
        if self.n:
            self.packed[:self.n].read(self.host)
        for position, offset, size, shape in self.members:
            found[position] = self.host[offset:offset + size].reshape(shape)

    def to_device(self, results, found, fresh):
        """Write ``results``' members into one host buffer, that into one
        device buffer, and put device views of it in ``found`` (a new buffer
        when ``fresh``, else one reused every step)."""
        from pygpu import gpuarray
        for position, offset, size, shape in self.members:
            source = np.asarray(results[position])
            target = self.host[offset:offset + size]
            if source.size != size:
                raise ValueError("the exchange returned %d elements for an array of %d"
                                 % (source.size, size))
            # Results are usually views of this very buffer's place already.
            if not np.shares_memory(source, target):
                np.copyto(target.reshape(source.shape), source, casting="unsafe")
        if fresh or self.results is None:
            buffer = gpuarray.empty((max(self.n, 1),), dtype=self.dtype, context=self.context)
            if not fresh:
                self.results = buffer
        else:
            buffer = self.results
        if self.n:
            buffer[:self.n].write(self.host)
        for position, offset, size, shape in self.members:
            found[position] = buffer[offset:offset + size].reshape(shape)


class Staging:
    """Moves one step's device arrays to the host and back, fused per dtype
    (see the module doc).  One per exchange node: its buffers fit that node's
    arrays and are reused every step."""

    def __init__(self):
        self._groups = {}

    def _plan(self, arrays, contexts):
        """The groups of the device positions (``contexts``: position ->
        device context), made once per signature."""
        key = tuple((p, tuple(np.shape(arrays[p])), np.dtype(arrays[p].dtype).str)
                    for p in sorted(contexts))
        groups = self._groups.get(key)
        if groups is None:
            by = {}
            for position in sorted(contexts):
                array = arrays[position]
                by.setdefault((id(contexts[position]), np.dtype(array.dtype).str),
                              (contexts[position], array.dtype, []))[2].append(
                    (position, tuple(array.shape)))
            groups = [_Group(context, dtype, members) for context, dtype, members in by.values()]
            if len(self._groups) >= 8:      # shapes that change every call: keep a few
                self._groups.pop(next(iter(self._groups)))
            self._groups[key] = groups
        return groups

    def to_host(self, arrays):
        """``arrays`` with every device array replaced by a host view of a
        fused buffer (one device-to-host copy per dtype)."""
        contexts = {p: a.context for p, a in enumerate(arrays) if is_device_array(a)}
        if not contexts:
            return list(arrays)
        found = list(arrays)
        for group in self._plan(arrays, contexts):
            group.to_host(arrays, found)
        return found

    def to_device(self, results, contexts, fresh=False):
        """``results`` with those at the positions of ``contexts`` (position ->
        device context) made device arrays, views of one fused buffer per
        dtype (one host-to-device copy per dtype)."""
        if not contexts:
            return list(results)
        found = list(results)
        for group in self._plan(results, contexts):
            group.to_device(results, found, fresh)
        return found
