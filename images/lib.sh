# shellcheck shell=bash
# Helpers shared by the image recipes (images/NAME.sh); sourced by images/build.
# Everything here is part of every image's cache key, so a change rebuilds all images.

log() { printf 'images: %s\n' "$*" >&2; }
die() { printf 'images: error: %s\n' "$*" >&2; exit 1; }

# Remove a build tree. --one-file-system because a killed root-mode mmdebstrap can leave
# /proc, /sys or /dev bind mounts inside it, and rm must never descend into the host's.
# chmod first because an unprivileged build can leave read-only directories behind.
remove_tree() {
    local dir=$1
    [ -e "$dir" ] || return 0
    if [ "$(id -u)" -ne 0 ]; then
        chmod -R u+rwX "$dir" 2>/dev/null || true
    fi
    rm -rf --one-file-system "$dir"
}

# Download one Debian package (the candidate version of the configured apt sources)
# into DIR and unpack it into DIR/root. Needs no root and ignores whatever copy of the
# package the host has installed.
fetch_deb() {
    local pkg=$1 dir=$2
    mkdir -p "$dir"
    # As root apt drops to the _apt user for downloads; let it write here, otherwise
    # apt warns and downloads unsandboxed.
    if [ "$(id -u)" -eq 0 ] && getent passwd _apt >/dev/null; then
        chown _apt "$dir"
    fi
    (cd "$dir" && apt-get download -q=2 "$pkg") >&2 ||
        die "apt-get download $pkg failed (is the apt cache current? try scripts/install-deps)"
    local debs=("$dir"/"${pkg}"_*.deb)
    [ -f "${debs[0]}" ] || die "apt-get download $pkg produced no .deb"
    dpkg-deb -x "${debs[0]}" "$dir/root"
}

# Print one "deb URI SUITE COMPONENTS" line per Debian bookworm suite configured on this
# machine (deb822 .sources files and one-line sources.list files), for mmdebstrap.
# Third-party repositories (Signed-By something other than Debian's archive keyring)
# are left out: the image should only contain Debian's own packages.
debian_apt_sources() {
    local f
    {
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -f "$f" ] || continue
            # Stanzas are separated by blank lines; print one line per (URI, suite).
            awk '
                function flush(   i, j, nu, ns, u, s) {
                    if (enabled && types ~ /(^| )deb( |$)/ && uris != "" &&
                        (signed == "" || signed ~ /debian-archive-keyring/)) {
                        nu = split(uris, u, " "); ns = split(suites, s, " ")
                        for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print "deb", u[i], s[j], comps
                    }
                    types = uris = suites = comps = signed = ""; enabled = 1
                }
                BEGIN { enabled = 1 }
                /^[ \t]*#/ { next }
                /^[ \t]*$/ { flush(); next }
                /^[ \t]/ { next }  # continuation line (an inline key): nothing we need
                {
                    key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
                    if (key == "types") types = $0
                    else if (key == "uris") uris = $0
                    else if (key == "suites") suites = $0
                    else if (key == "components") comps = $0
                    else if (key == "signed-by") signed = ($0 == "" ? "inline key" : $0)
                    else if (key == "enabled" && tolower($0) == "no") enabled = 0
                }
                END { flush() }
            ' "$f"
        done
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [ -f "$f" ] || continue
            # Drop options in [brackets] unless they point at the Debian keyring.
            awk '$1 == "deb" {
                if ($2 ~ /^\[/) {
                    opts = ""; i = 2
                    while (i <= NF) { opts = opts " " $i; if ($i ~ /\]$/) break; i++ }
                    if (opts ~ /signed-by=/ && opts !~ /debian-archive-keyring/) next
                    line = "deb"; for (i = i + 1; i <= NF; i++) line = line " " $i
                    print line
                } else print
            }' "$f"
        done
    } | awk '$3 ~ /^bookworm(-updates|-security)?$/' | sort -u
}

# Give ROOTFS the layout of an image made by `enroot import` from a container image
# without ENTRYPOINT/CMD: /etc/rc (cd to the working directory "/", then run the
# arguments, or a shell without them), /etc/environment (KEY=VALUE lines, one per
# argument), an /etc/fstab without entries, and empty /etc/hosts, /etc/resolv.conf and
# /etc/hostname as targets for the files the sandbox binds over them.
write_enroot_layout() {
    local rootfs=$1
    shift
    mkdir -p "$rootfs/etc"

    # Not executable and without #!, like enroot's own: runtimes run it as `sh /etc/rc ARGS`.
    # The rc.local hook is kept because enroot images may rely on it to adjust "$@".
    cat >"$rootfs/etc/rc" <<'RC'
# Entry point of this image (enroot layout), run as: sh /etc/rc [COMMAND [ARG...]]
cd "/" || exit 1
unset OLDPWD

# Optional site hook; it may change the positional parameters.
if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

# Run the given command, or an interactive shell when there is none.
if [ "$#" -eq 0 ]; then
    set -- /bin/sh
fi
exec "$@"
RC
    chmod 0644 "$rootfs/etc/rc"

    : >"$rootfs/etc/environment"
    local kv
    for kv in "$@"; do
        printf '%s\n' "$kv" >>"$rootfs/etc/environment"
    done

    printf '# No extra mounts for this image (enroot fstab format).\n' >"$rootfs/etc/fstab"

    # rm first: mmdebstrap copies the host's files here, and one could be a symlink.
    local f
    for f in hosts resolv.conf hostname; do
        rm -f "$rootfs/etc/$f"
        : >"$rootfs/etc/$f"
    done
    chmod 0644 "$rootfs"/etc/{environment,fstab,hosts,resolv.conf,hostname}
}
