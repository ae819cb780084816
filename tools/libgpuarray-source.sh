#!/bin/sh
# libgpuarray v0.7.6's source (libgpuarray and pygpu), the release Theano 1.0.5 expects, from
# Debian's source package with apt (Debian, Ubuntu; root): the upstream tarball of the source
# package, without Debian's patches, unpacked into DIR/libgpuarray-0.7.6, whose path it prints.
#
#   make gpu LIBGPUARRAY_SRC=$(sh tools/libgpuarray-source.sh build/libgpuarray)
#
# apt reads deb-src lines of its own for this one call (the twins of the machine's deb lines, in
# a temporary list): the machine's apt configuration is left as it is. A tarball already in DIR
# is used as it is.
set -eu
dir=${1:-build/libgpuarray}
version=0.7.6
tarball=libgpuarray_$version.orig.tar.gz
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
tree=$dir/libgpuarray-$version

if [ ! -f "$dir/$tarball" ]; then
    command -v apt-get >/dev/null 2>&1 || {
        echo "libgpuarray-source: no apt here: git clone https://github.com/Theano/libgpuarray" \
             "-b v$version" >&2; exit 1; }
    apt=$(mktemp -d)
    trap 'rm -rf "$apt"' EXIT
    mkdir -p "$apt/parts" "$apt/lists/partial"
    # deb-src twins of the deb lines (one-line lists and deb822 .sources files alike).
    for list in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$list" ] && sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$list"
    done > "$apt/sources.list"
    for sources in /etc/apt/sources.list.d/*.sources; do
        [ -f "$sources" ] && sed 's/^Types:.*/Types: deb-src/' "$sources" \
            > "$apt/parts/$(basename "$sources")"
    done
    set -- -o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts="$apt/parts" \
        -o Dir::State::Lists="$apt/lists" -o APT::Sandbox::User=root
    apt-get "$@" update -qq >&2 || { echo "libgpuarray-source: apt-get update failed" >&2; exit 1; }
    found=$(apt-cache "$@" showsrc libgpuarray 2>/dev/null | sed -n 's/^Version: //p' | head -1)
    case $found in
        "$version"-*) ;;
        "") echo "libgpuarray-source: apt knows no source package libgpuarray" >&2; exit 1 ;;
        *) echo "libgpuarray-source: apt's libgpuarray is $found, not $version" >&2; exit 1 ;;
    esac
    (cd "$dir" && apt-get "$@" source --download-only "libgpuarray=$found" >&2) || {
        echo "libgpuarray-source: apt-get source libgpuarray=$found could not fetch the" \
             "source (above)" >&2; exit 1; }
    rm -f "$dir"/libgpuarray_*.dsc "$dir"/libgpuarray_*.debian.tar.*
fi
rm -rf "$tree" && mkdir -p "$tree"
tar -xzf "$dir/$tarball" -C "$tree" --strip-components=1
[ -f "$tree/CMakeLists.txt" ] && [ -f "$tree/setup.py" ] || {
    echo "libgpuarray-source: $dir/$tarball holds no libgpuarray source tree" >&2; exit 1; }
echo "$tree"
