"""Escapes through the network: host loopback services, abstract unix sockets, raw and packet
sockets, and netlink or ioctl requests that would reconfigure networking."""
import select
import socket

import pytest


def _primary_host_address():
    """The host's address on its default route, or None without one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def _accepted(server, seconds):
    ready, _, _ = select.select([server], [], [], seconds)
    return bool(ready)


def test_host_tcp_and_udp_services_are_unreachable(box):
    """A TCP server on the host's 127.0.0.1 (and on all addresses, and ::1 where the host has
    IPv6), a UDP socket on 127.0.0.1: the payload connects to nothing, the servers see nothing."""
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", 0))
    tcp.listen(8)
    port = tcp.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp_port = udp.getsockname()[1]
    tcp6 = None
    try:
        tcp6 = socket.socket(socket.AF_INET6)
        tcp6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        tcp6.bind(("::1", port))
        tcp6.listen(8)
    except OSError:
        tcp6 = None  # the host has no IPv6 loopback: nothing to reach there
    primary = _primary_host_address()
    targets = ["127.0.0.1"] + ([primary] if primary else [])
    try:
        result, res = box.py_results("""
            import socket
            port, udp_port = int(sys.argv[2]), int(sys.argv[3])
            for i, host in enumerate(sys.argv[4:]):
                attempt(f"tcp_{i}", socket.create_connection, (host, port), 3)
            attempt("tcp6", socket.create_connection, ("::1", port), 3)
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            attempt("udp_send", u.sendto, b"from the sandbox", ("127.0.0.1", udp_port))
            finish()
        """, port, udp_port, *targets)
        accepted = _accepted(tcp, 0.3) or (tcp6 is not None and _accepted(tcp6, 0.1))
        received = _accepted(udp, 0.3)
    finally:
        tcp.close()
        udp.close()
        if tcp6 is not None:
            tcp6.close()
    assert res["tcp_0"] == "ECONNREFUSED", res
    for i in range(1, len(targets)):
        assert res[f"tcp_{i}"] in ("ENETUNREACH", "EHOSTUNREACH"), res
    # The sandbox's loopback is its own: refused if it has ::1, unreachable if it does not.
    assert res["tcp6"] in ("ECONNREFUSED", "EADDRNOTAVAIL", "ENETUNREACH"), res
    assert res["udp_send"] == "ok", res  # sent, but to the sandbox's own loopback
    assert not accepted, "a host TCP server accepted a connection from the sandbox"
    assert not received, "a host UDP socket received a datagram from the sandbox"


def test_host_abstract_unix_socket_is_unreachable(box, marker):
    """Abstract unix sockets belong to the network namespace (X11, D-Bus, containerd listen
    on them)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = "\0" + marker
    server.bind(name)
    server.listen(4)
    try:
        result, res = box.py_results("""
            import socket
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            attempt("connect", c.connect, "\\0" + sys.argv[1])
            finish()
        """)
        accepted = _accepted(server, 0.3)
    finally:
        server.close()
    assert res["connect"] == "ECONNREFUSED", res
    assert not accepted


@pytest.mark.parametrize("options", [[], ["--root"]], ids=["own-uid", "--root"])
def test_raw_and_packet_sockets_are_refused(box, options):
    result, res = box.py_results("""
        import socket
        attempt("inet_raw_icmp", socket.socket, socket.AF_INET, socket.SOCK_RAW, 1)
        attempt("inet_raw_tcp", socket.socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
        attempt("inet_raw_raw", socket.socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        attempt("inet6_raw", socket.socket, socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
        attempt("packet_raw", socket.socket, socket.AF_PACKET, socket.SOCK_RAW, 0x0300)
        attempt("packet_dgram", socket.socket, socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300)
        finish()
    """, options=options)
    for key in ("inet_raw_icmp", "inet_raw_tcp", "inet_raw_raw", "inet6_raw", "packet_raw",
                "packet_dgram"):
        # EPERM: no CAP_NET_RAW (or the seccomp profile); EAFNOSUPPORT where the family is out
        assert res[key] in ("EPERM", "EAFNOSUPPORT"), (key, res)


NETLINK = r'''
import socket, struct
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 1, 4, 0x200, 0x400
RTM_NEWLINK, RTM_NEWADDR, RTM_NEWROUTE, RTM_DELADDR = 16, 20, 24, 21

def rtattr(kind, data):
    length = 4 + len(data)
    return struct.pack("HH", length, kind) + data + b"\0" * ((4 - length % 4) % 4)

def request(sock, kind, body, flags, seq):
    header = struct.pack("IHHII", 16 + len(body), kind, NLM_F_REQUEST | NLM_F_ACK | flags, seq, 0)
    sock.send(header + body)
    reply = sock.recv(65536)
    length, rtype, _, rseq, _ = struct.unpack("IHHII", reply[:16])
    if rtype != 2:  # NLMSG_ERROR carries the ack
        return "no-ack"
    code = struct.unpack("i", reply[16:20])[0]
    return "ok" if code == 0 else ename(-code)

def lo_flags():
    import fcntl
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ifreq = fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0))  # SIOCGIFFLAGS
    return struct.unpack("16sH14x", ifreq)[1]
'''


def test_netlink_route_cannot_change_anything(box):
    """Add an address, set lo down, add a route, create a dummy link: each EPERM."""
    result, res = box.py_results("""
        ip = socket.inet_aton
        flags_before = lo_flags()
        sock = attempt("socket", socket.socket, socket.AF_NETLINK, socket.SOCK_RAW, 0)
        if sock is not None:
            sock.bind((0, 0))
            addr = struct.pack("BBBBI", socket.AF_INET, 24, 0, 0, 1)
            addr += rtattr(2, ip("10.99.0.1")) + rtattr(1, ip("10.99.0.1"))
            RESULTS["add_address"] = request(sock, RTM_NEWADDR, addr, NLM_F_CREATE | NLM_F_EXCL, 1)
            dele = struct.pack("BBBBI", socket.AF_INET, 8, 0, 0, 1) + rtattr(2, ip("127.0.0.1"))
            RESULTS["delete_loopback_address"] = request(sock, RTM_DELADDR, dele, 0, 2)
            down = struct.pack("BBHiII", socket.AF_UNSPEC, 0, 0, 1, 0, 1)  # IFF_UP cleared
            RESULTS["set_lo_down"] = request(sock, RTM_NEWLINK, down, 0, 3)
            route = struct.pack("BBBBBBBBI", socket.AF_INET, 16, 0, 0, 254, 4, 0, 1, 0)
            route += rtattr(1, ip("10.98.0.0")) + rtattr(4, struct.pack("I", 1))
            RESULTS["add_route"] = request(sock, RTM_NEWROUTE, route, NLM_F_CREATE | NLM_F_EXCL, 4)
            link = struct.pack("BBHiII", socket.AF_UNSPEC, 0, 0, 0, 0, 0)
            link += rtattr(3, b"evil0\\0") + rtattr(18, rtattr(1, b"dummy\\0"))
            RESULTS["create_link"] = request(sock, RTM_NEWLINK, link, NLM_F_CREATE | NLM_F_EXCL, 5)
        finish(flags_before=flags_before, flags_after=lo_flags(),
               routes=open("/proc/net/route").read(),
               links=[l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]])
    """, helpers=NETLINK)
    if res["socket"] == "ok":
        for key in ("add_address", "delete_loopback_address", "set_lo_down", "add_route",
                    "create_link"):
            assert res[key] == "EPERM", (key, res)
    else:  # a profile may refuse netlink sockets altogether
        assert res["socket"] in ("EPERM", "EAFNOSUPPORT"), res
    assert res["flags_before"] & 1 and res["flags_after"] == res["flags_before"], res
    assert "0062" not in res["routes"]  # 10.98.0.0 in /proc/net/route's hex
    assert res["links"] == ["lo"], res


def test_interface_ioctls_cannot_change_anything(box):
    result, res = box.py_results("""
        import fcntl
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        before = lo_flags()
        attempt("set_lo_down", fcntl.ioctl, s, 0x8914, struct.pack("16sH14x", b"lo", 0))
        sin = struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton("10.97.0.1"))
        attempt("set_address", fcntl.ioctl, s, 0x8916, struct.pack("16s16s8x", b"lo", sin))
        attempt("set_mtu", fcntl.ioctl, s, 0x8922, struct.pack("16si20x", b"lo", 1280))
        attempt("rename", fcntl.ioctl, s, 0x8923, struct.pack("16s16s8x", b"lo", b"evil0"))
        finish(before=before, after=lo_flags())
    """, helpers=NETLINK)
    for key in ("set_lo_down", "set_address", "set_mtu", "rename"):
        assert res[key] == "EPERM", (key, res)
    assert res["after"] == res["before"], res
