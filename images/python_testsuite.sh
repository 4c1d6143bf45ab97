# shellcheck shell=bash
# python_testsuite: the python image plus CPython's own test suite (Debian's
# libpython3.11-testsuite), for tests/integration/test_cpython_slice.py, which runs a slice of it
# inside a sandbox and outside with the host's identical Python. A recipe of its own so that the
# python image, which the benchmarks time, stays as small as it is.
#
# The same packages and options as python.sh (kept in step by hand: a recipe's cache key covers
# only its own file, lib.sh and build).

build_rootfs() {
    local rootfs=$1 work=$2

    local sources=()
    mapfile -t sources < <(debian_apt_sources)
    if [ "${#sources[@]}" -eq 0 ]; then
        log "no Debian bookworm entries in /etc/apt, using deb.debian.org"
        sources=("deb http://deb.debian.org/debian bookworm main")
    fi

    local opts=(
        --variant=essential --include=python3,libpython3.11-testsuite
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
        --dpkgopt='path-exclude=/usr/share/man/*'
        --dpkgopt='path-exclude=/usr/share/info/*'
        --dpkgopt='path-exclude=/usr/share/doc/*'
        --dpkgopt='path-include=/usr/share/doc/*/copyright'
        --dpkgopt='path-exclude=/usr/share/locale/*'
        --dpkgopt='path-include=/usr/share/locale/locale.alias'
        --dpkgopt='path-exclude=/usr/share/lintian/*'
        --dpkgopt='path-exclude=/usr/share/bug/*'
    )

    if [ "$(id -u)" -eq 0 ]; then
        TMPDIR=$work mmdebstrap --mode=root --format=directory "${opts[@]}" \
            bookworm "$rootfs" "${sources[@]}"
    else
        mmdebstrap --mode=unshare --format=tar "${opts[@]}" bookworm "$work/rootfs.tar" "${sources[@]}"
        tar -C "$rootfs" -xpf "$work/rootfs.tar" --no-same-owner --exclude='./dev/*'
        rm -f "$work/rootfs.tar"
    fi
    find "$rootfs/dev" -mindepth 1 -delete
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* \
        "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old \
        "$rootfs"/var/cache/ldconfig/aux-cache "$rootfs"/var/log/*

    [ -x "$rootfs/usr/bin/python3" ] || die "python3 missing from the rootfs"
    [ -f "$rootfs/usr/lib/python3.11/test/regrtest.py" ] || die "CPython's test suite missing"

    write_enroot_layout "$rootfs" \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8
}
