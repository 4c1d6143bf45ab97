# shellcheck shell=bash
# busybox: the smallest useful image. Debian's statically linked busybox with a symlink
# per applet, so it needs no libc in the image; for fast, dependency-free runtime tests.

build_rootfs() {
    local rootfs=$1 work=$2

    # Take busybox from the archive, not from the host, so the image does not depend on
    # what (or which version) the build machine has installed.
    fetch_deb busybox-static "$work/deb"
    install -D -m 0755 "$work/deb/root/bin/busybox" "$rootfs/bin/busybox"

    # One symlink per applet at its usual path (bin/sh, usr/bin/awk, ...). Entries
    # without a directory (linuxrc) are initramfs-only and skipped.
    local applet
    while IFS= read -r applet; do
        [[ $applet == */* ]] || continue
        [ "$applet" != bin/busybox ] || continue
        mkdir -p "$rootfs/${applet%/*}"
        ln -sfn /bin/busybox "$rootfs/$applet"
    done < <("$rootfs/bin/busybox" --list-full)
    [ -L "$rootfs/bin/sh" ] || die "busybox has no sh applet"

    # Mount points and scratch directories a runtime expects to find.
    mkdir -p "$rootfs"/{proc,dev,sys,etc,root,tmp,var/tmp}
    chmod 0700 "$rootfs/root"
    chmod 1777 "$rootfs/tmp" "$rootfs/var/tmp"

    # Just enough of a user database for id/whoami and for the runtime to name uid 0
    # and the overflow id 65534 (unmapped ids show up as that inside user namespaces).
    cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
PASSWD
    cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
nogroup:x:65534:
GROUP

    write_enroot_layout "$rootfs" \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
}
