#!/usr/bin/env bash
# `make gpu`: Theano's GPU backend in the project's venv: libgpuarray and pygpu 0.7.6 (the release
# Theano 1.0.5 expects), and, where apt is at hand, pocl: an OpenCL device on the CPU, on which the
# test suite's device tests run where no GPU is.
#
#   make gpu                              # apt (Debian/Ubuntu, as root): Debian's builds, which
#                                         # open CUDA, cuBLAS, NCCL or OpenCL at run time, + pocl
#   make gpu LIBGPUARRAY_SRC=path         # elsewhere: build from a libgpuarray v0.7.6 source tree
#
# Then THEANO_FLAGS=device=cuda (every rank of a host takes one of its GPUs in turn), device=cuda0,
# or $(cat .venv/opencl-theano-flags) for the OpenCL device on the CPU.
set -eu
venv=${VENV:-.venv}
py=$venv/bin/python
[ -x "$py" ] || { echo "make gpu: no $venv here: run make install first" >&2; exit 1; }
# Absolute from here on: the source build runs its commands from a folder of its own.
venv=$(cd "$venv" && pwd); py=$venv/bin/python
constraints=${CONSTRAINTS:-constraints.txt}
purelib=$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pip() { $py -m pip install --quiet --disable-pip-version-check -c "$constraints" "$@"; }
pip mako          # pygpu's kernels are Mako templates

if [ -n "${LIBGPUARRAY_SRC:-}" ]; then
    src=$(cd "$LIBGPUARRAY_SRC" && pwd)
    prefix=$(cd "$venv" && pwd)/gpuarray
    [ -f "$src/CMakeLists.txt" ] && [ -f "$src/setup.py" ] || {
        echo "make gpu: $src is not a libgpuarray source tree (git clone" \
             "https://github.com/Theano/libgpuarray -b v0.7.6)" >&2; exit 1; }
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    cp -r "$src/." "$build/"
    # CMake 4 refuses the OLD behaviour of CMP0063 that v0.7.6 asks for, and policies
    # older than 3.5 unless told the minimum.
    sed -i '/CMP0063 OLD/d' "$build/CMakeLists.txt"
    (mkdir -p "$build/Build" && cd "$build/Build" &&
        cmake .. -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_BUILD_TYPE=Release \
              -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null && make -j"$(nproc)" >/dev/null &&
        make install >/dev/null)
    pip 'cython<3'    # pygpu 0.7.6's Cython sources predate Cython 3
    # build_ext builds the extensions, build_py brings pygpu's Python modules beside them;
    # the rpath lets pygpu find libgpuarray without LD_LIBRARY_PATH.
    (cd "$build" && $py setup.py -q build_ext -L "$prefix/lib" -I "$prefix/include" \
            -R "$prefix/lib" >/dev/null && $py setup.py -q build_py >/dev/null &&
        rm -rf "$purelib/pygpu" && cp -r build/lib.*/pygpu "$purelib/")
    # Theano compiles its GPU ops against libgpuarray's headers and library.
    cat > "$venv/gpuarray-env" <<ENV
export CPATH=$prefix/include\${CPATH:+:\$CPATH}
export LIBRARY_PATH=$prefix/lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}
export LD_LIBRARY_PATH=$prefix/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
ENV
    echo "make gpu: libgpuarray and pygpu built into $prefix; source $venv/gpuarray-env"
elif command -v apt-get >/dev/null 2>&1; then
    packages="pocl-opencl-icd ocl-icd-libopencl1 libclblast-dev libgpuarray-dev python3-pygpu"
    if ! dpkg -s $packages >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] || { echo "make gpu: installing $packages needs root (sudo make gpu)" >&2; exit 1; }
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null
    fi
    # Only pygpu from the system's site-packages (its numpy would shadow the venv's): a folder
    # holding just a link to it, on the venv's path through a .pth file.
    system=$(dpkg -L python3-pygpu | grep -m1 '/pygpu/__init__.py$' | xargs dirname)
    mkdir -p "$venv/gpu-site"
    ln -sfn "$system" "$venv/gpu-site/pygpu"
    echo "$(cd "$venv" && pwd)/gpu-site" > "$purelib/tmpi-pygpu.pth"
else
    echo "make gpu: no apt here; build libgpuarray and pygpu 0.7.6 from source:" >&2
    echo "  git clone https://github.com/Theano/libgpuarray -b v0.7.6" >&2
    echo "  make gpu LIBGPUARRAY_SRC=libgpuarray" >&2
    exit 1
fi

# Flags for the OpenCL device on the CPU (pocl): Theano's softmax kernels do not build there and
# its GPU scan is CUDA only, so those few ops stay on the host (Theano moves the arrays itself).
exclude=local_gpua_crossentropysoftmaxargmax1hotwithbias:local_gpua_crossentropysoftmax1hotwithbiasdx
exclude=$exclude:local_gpua_softmax:local_gpua_softmaxwithbias:local_gpua_scan_to_gpua
echo "device=opencl0:0,optimizer_excluding=$exclude" > "$venv/opencl-theano-flags"
$py - <<'PY'
import pygpu
try:
    context = pygpu.init("opencl0:0")
    print("make gpu: pygpu %s; OpenCL device opencl0:0 is %s" % (pygpu.__version__,
                                                                 context.devname.strip()))
except Exception as error:  # a CUDA machine without OpenCL is fine
    print("make gpu: pygpu %s; no OpenCL device (%s)" % (pygpu.__version__, error))
PY
