# shellcheck shell=bash
# python: Debian bookworm's "essential" package set plus python3 (no apt, no docs), the
# image the benchmarks and the Python-driver tests run model-style code in.

build_rootfs() {
    local rootfs=$1 work=$2

    # Use the mirrors this machine's apt is configured with: they are the ones known to
    # be reachable (possibly a local mirror or the only route out).
    local sources=()
    mapfile -t sources < <(debian_apt_sources)
    if [ "${#sources[@]}" -eq 0 ]; then
        log "no Debian bookworm entries in /etc/apt, using deb.debian.org"
        sources=("deb http://deb.debian.org/debian bookworm main")
    fi

    local opts=(
        --variant=essential --include=python3
        # Set up merged /usr with symlinks the way debootstrap (and so Debian's own
        # container images) do; the default, the usrmerge package, drags in ~50 MB of perl.
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
        # Leave out what a sandbox never reads; keep copyright files for the licences.
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
        # TMPDIR inside the build dir: whatever a killed mmdebstrap leaves behind is
        # swept away with it.
        TMPDIR=$work mmdebstrap --mode=root --format=directory "${opts[@]}" \
            bookworm "$rootfs" "${sources[@]}"
    else
        # In unshare mode a directory would end up owned by subordinate ids we cannot
        # modify or delete; a tarball unpacked as ourselves avoids that, and mksquashfs
        # -all-root makes the ownership irrelevant anyway. /dev nodes are skipped like
        # enroot does: the runtime mounts its own /dev.
        mmdebstrap --mode=unshare --format=tar "${opts[@]}" bookworm "$work/rootfs.tar" "${sources[@]}"
        tar -C "$rootfs" -xpf "$work/rootfs.tar" --no-same-owner --exclude='./dev/*'
        rm -f "$work/rootfs.tar"
    fi
    # Root mode may have created device nodes; the runtime provides /dev itself.
    find "$rootfs/dev" -mindepth 1 -delete

    # mmdebstrap cleans most of this already; be explicit so the image stays small even
    # if its defaults change.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* \
        "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old \
        "$rootfs"/var/cache/ldconfig/aux-cache "$rootfs"/var/log/*

    [ -x "$rootfs/usr/bin/python3" ] || die "python3 missing from the rootfs"

    write_enroot_layout "$rootfs" \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        LANG=C.UTF-8
}
