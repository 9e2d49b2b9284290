#!/usr/bin/env python3
"""N emulated "hosts" on one machine: Linux network namespaces behind a switch, links shaped by tbf.

This generalises ``bench/mpi-two-hosts.sh`` (two namespaces joined by one veth pair) to any
number of hosts, with a bandwidth limit per host link, for benchmarks that need "machines" with
a known network between them while running on a single box. Python 3.11, standard library only;
needs root and the ``ip``, ``tc`` (only when a rate is given) and ``unshare`` commands.

Topology (one ``Hosts`` instance)::

        host ns h1              host ns h2                host ns hN
      eth0 10.O.0.1/24        eth0 10.O.0.2/24    ...   eth0 10.O.0.N/24
      [tbf RATE egress]       [tbf RATE egress]         [tbf RATE egress]
          |  veth                 |  veth                   |  veth
      p1 [tbf RATE egress]    p2 [tbf RATE egress]      pN [tbf RATE egress]
          +-----------+-----------+----------- ... ---------+
                      |   br0 (Linux bridge, no address)
                    switch ns

* N + 1 namespaces: one per host (``<base>h1`` .. ``<base>hN``) and one ``<base>sw`` holding a
  Linux bridge ``br0``. ``<base>`` is ``lsgd<pid>x<counter>`` (plus ``-<tag>`` when a tag is
  given), so concurrent instances, in this process or others, never collide.
* Per host one veth pair, created directly inside the namespaces (``ip -n SW link add pI type
  veth peer name eth0 netns HOST``): ``eth0`` in the host namespace carries the host's address
  ``10.<subnet_octet>.0.<i+1>/24``; ``pI`` in the switch namespace is a port of ``br0``. The
  interface names never exist in the machine's own namespace, which is why they can be short
  and fixed (``iface(i)`` is ``"eth0"`` for every host).
* ``lo`` is up in every namespace (and never shaped: tbf on ``lo`` stalls TCP).
* Shaping (``rate`` not None): ``tc qdisc add dev D root tbf rate RATE burst 256kb latency 50ms``
  on BOTH ends of every host link, ``eth0`` in the host namespace (host -> switch) and ``pI``
  in the switch namespace (switch -> host). Each host therefore has a full-duplex link of RATE
  to a non-blocking switch, like a real NIC: a host can send RATE and receive RATE at the same
  time, and N hosts sending to one host share that host's RATE downlink. (``netem`` is not
  available on this kernel, so there is no added delay beyond queueing.)
* IPv6 address generation is switched off on the links (``addrgenmode none``) so that no
  router solicitations / DAD / MLD chatter inflates ``tx_bytes`` and no MPI/gloo component
  picks an IPv6 link-local address. No sysctl is written anywhere.

Only addresses inside the namespaces created here are used (``10.<subnet_octet>.0.0/24``): the
machine's own namespace gets no interface, address, route, qdisc or sysctl, so nothing here can
disturb its network or be disturbed by it, and two instances may even use the same subnet at the
same time (each has its own private switch). Programs run in a host with ``prefix(i)`` and MPI
jobs built by ``mpirun(...)`` are told (``btl_tcp_if_include``/``oob_tcp_if_include``) to use
only that subnet, so all inter-host traffic crosses the shaped links.

Cleanup removes the N + 1 namespaces and a temporary directory (MPI launch agent, hostfiles).
Deleting the switch namespace destroys the bridge and the switch ends of all veth pairs, and a
veth pair dies with either end, so every link disappears even if some process still lingers
inside a host namespace (such a namespace lives on, unnamed and cut off, until its last process
exits). Cleanup runs on ``close()`` (idempotent), on leaving the ``with`` block (normally or by
exception), from ``atexit``, and from SIGTERM/SIGINT handlers that clean up and then re-deliver
the signal to the previous handler (SIGINT -> KeyboardInterrupt, SIGTERM -> death by SIGTERM).
If creation fails halfway, what was created is removed before the error (``NetnsError``) is
raised. Only the process that created an instance cleans it up (a forked child exiting does not
tear down its parent's hosts). SIGKILL cannot be caught: ``python3 bench/netns_hosts.py
cleanup`` removes namespaces left behind by dead processes.

Command line::

    python3 bench/netns_hosts.py selftest   # shaped/unshaped TCP transfer, mpirun, cleanup
    python3 bench/netns_hosts.py cleanup    # remove leftovers of processes that no longer exist
"""

from __future__ import annotations

import atexit
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

__all__ = ["Hosts", "NetnsError", "remove_stale"]

#: Seconds any single ``ip``/``tc`` call may take before it counts as failed.
CMD_TIMEOUT_S = 30
#: tbf parameters besides the rate (see the module docstring).
TBF_BURST = "256kb"
TBF_LATENCY = "50ms"
#: Interface name of every host's link inside its namespace.
HOST_IFACE = "eth0"
_BRIDGE = "br0"
_NAME_PREFIX = "lsgd"
_STALE_RE = re.compile(r"^lsgd(\d+)x\d+")


class NetnsError(RuntimeError):
    """Creating or using the emulated hosts failed (not root, a command failed, ...)."""


def _run(argv: list[str], what: str, timeout: float = CMD_TIMEOUT_S) -> str:
    """Run a short command; return its stdout; raise NetnsError("<what> failed: ...") otherwise."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise NetnsError(f"{what} timed out after {timeout} s: {shlex.join(argv)}") from None
    except OSError as e:
        raise NetnsError(f"{what} failed: {shlex.join(argv)}: {e}") from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
        raise NetnsError(f"{what} failed: {msg} (command: {shlex.join(argv)})")
    return proc.stdout


def _try(argv: list[str]) -> None:
    """Run a cleanup command, ignoring every failure (the thing may already be gone)."""
    try:
        subprocess.run(argv, capture_output=True, timeout=CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        pass


def _netns_names() -> list[str]:
    """Names in ``ip netns list`` (first word of each line)."""
    out = _run(["ip", "netns", "list"], "ip netns list")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# Process-wide bookkeeping: live instances, atexit and signal handlers.

_live: list["Hosts"] = []          # instances created by this process and not yet closed
_live_lock = threading.RLock()
_counter = 0
_handlers_installed = False
_atexit_installed = False
_prev_handlers: dict[int, Any] = {}


def _close_all() -> None:
    with _live_lock:
        instances = list(_live)
    for h in reversed(instances):
        h.close()


def _on_signal(signum: int, frame: Any) -> None:
    """Clean up every live instance, then behave as the handler we replaced would have."""
    _close_all()
    prev = _prev_handlers.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)              # e.g. signal.default_int_handler -> KeyboardInterrupt
        return
    # SIG_DFL (or None: installed from C): die from the same signal, as if never caught.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """Once per process: an atexit hook; and, the first time this runs in the main thread
    (signal.signal works nowhere else), SIGTERM/SIGINT handlers. Signals the program already
    ignores stay ignored."""
    global _atexit_installed, _handlers_installed
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(_close_all)
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    _handlers_installed = True
    for sig in (signal.SIGTERM, signal.SIGINT):
        prev = signal.getsignal(sig)
        if prev is signal.SIG_IGN:
            continue
        _prev_handlers[sig] = prev
        signal.signal(sig, _on_signal)


def remove_stale() -> list[str]:
    """Delete namespaces named by this module for processes that no longer exist.

    Only names matching ``lsgd<pid>x<counter>...`` whose ``<pid>`` is not a running process are
    removed (a process killed with SIGKILL cannot clean up after itself). Returns the names.
    """
    removed = []
    for name in _netns_names():
        m = _STALE_RE.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        try:
            os.kill(pid, 0)
            continue                     # still running (or pid reused): leave it alone
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _try(["ip", "netns", "del", name])
        removed.append(name)
    return removed


# ---------------------------------------------------------------------------------------------

class Hosts:
    """``n_hosts`` emulated hosts (network namespaces) on a switch; see the module docstring.

    Use as a context manager (``with Hosts(4, "1gbit") as hs: ...``) or call ``close()``.
    Everything is created in ``__init__``; ``__enter__`` just returns the instance.

    Attributes:
        n: number of hosts.
        addresses: host i's IPv4 address, ``"10.<subnet_octet>.0.<i+1>"``.
        subnet: ``"10.<subnet_octet>.0.0/24"``.
        hostnames: host i's host name inside ``prefix(i)`` / MPI, ``"h<i+1>"``.
        namespaces: host i's network namespace name (for ``ip netns exec`` / ``ip -n``).
        switch_ns: the switch namespace's name.
        rate: the tc rate string, or None when unshaped.
        workdir: temporary directory holding the MPI launch agent and hostfiles.
    """

    def __init__(self, n_hosts: int, rate: str | None, subnet_octet: int = 200,
                 tag: str | None = None):
        """Create the namespaces, switch, links and shaping.

        Args:
            n_hosts: 1 .. 253 hosts.
            rate: a tc rate such as "1gbit", "10gbit", "100mbit"; None for unshaped links.
            subnet_octet: the second octet X of the subnet 10.X.0.0/24 (0 .. 255).
            tag: optional label (letters, digits, '_', '-') added to the namespace names.

        Raises:
            NetnsError: not root, a required command is missing, or a setup command failed
                (its stderr is in the message); partially created state is removed first.
            ValueError: bad arguments.
        """
        global _counter
        if not isinstance(n_hosts, int) or not 1 <= n_hosts <= 253:
            raise ValueError(f"n_hosts must be an int in 1..253, got {n_hosts!r}")
        if not isinstance(subnet_octet, int) or not 0 <= subnet_octet <= 255:
            raise ValueError(f"subnet_octet must be an int in 0..255, got {subnet_octet!r}")
        if rate is not None and (not isinstance(rate, str) or not re.fullmatch(r"[0-9.]+[A-Za-z]*", rate)):
            raise ValueError(f"rate must be a tc rate string like '1gbit' or None, got {rate!r}")
        if tag is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", tag):
            raise ValueError(f"tag must match [A-Za-z0-9_-]{{1,40}}, got {tag!r}")

        self.n = n_hosts
        self.rate = rate
        self.subnet = f"10.{subnet_octet}.0.0/24"
        self.addresses = [f"10.{subnet_octet}.0.{i + 1}" for i in range(n_hosts)]
        self.hostnames = [f"h{i + 1}" for i in range(n_hosts)]
        self._owner_pid = os.getpid()
        self._closed = False
        # Resources to remove, appended BEFORE each is created (removing a missing one is harmless).
        self._to_delete_ns: list[str] = []
        self.workdir: str | None = None

        with _live_lock:
            _counter += 1
            base = f"{_NAME_PREFIX}{os.getpid()}x{_counter}" + (f"-{tag}" if tag else "")
        self.namespaces = [f"{base}h{i + 1}" for i in range(n_hosts)]
        self.switch_ns = f"{base}sw"

        if os.geteuid() != 0:
            raise NetnsError("netns_hosts: not root (network namespaces, veth and tc need root)")
        needed = ["ip", "unshare"] + (["tc"] if rate is not None else [])
        missing = [c for c in needed if shutil.which(c) is None]
        if missing:
            raise NetnsError(f"netns_hosts: command(s) not found: {', '.join(missing)}")

        with _live_lock:
            _live.append(self)
        _install_handlers()
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    # -- creation -----------------------------------------------------------------------------

    def _create(self) -> None:
        sw = self.switch_ns
        self._add_ns(sw)
        _run(["ip", "-n", sw, "link", "set", "lo", "up"], f"ip -n {sw} link set lo up")
        _run(["ip", "-n", sw, "link", "add", _BRIDGE, "type", "bridge"], "ip link add bridge")
        _try(["ip", "-n", sw, "link", "set", _BRIDGE, "addrgenmode", "none"])
        _run(["ip", "-n", sw, "link", "set", _BRIDGE, "up"], "ip link set bridge up")

        for i, ns in enumerate(self.namespaces):
            port = self._port(i)
            self._add_ns(ns)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"], f"ip -n {ns} link set lo up")
            _run(["ip", "-n", sw, "link", "add", port, "type", "veth",
                  "peer", "name", HOST_IFACE, "netns", ns], f"ip link add veth for host {i}")
            # Best effort: without IPv6 the kernel rejects addrgenmode, which is fine.
            _try(["ip", "-n", ns, "link", "set", HOST_IFACE, "addrgenmode", "none"])
            _try(["ip", "-n", sw, "link", "set", port, "addrgenmode", "none"])
            _run(["ip", "-n", sw, "link", "set", port, "master", _BRIDGE], f"ip link set {port} master")
            _run(["ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", HOST_IFACE],
                 f"ip addr add for host {i}")
            if self.rate is not None:
                for where, dev in ((ns, HOST_IFACE), (sw, port)):
                    _run(["tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf",
                          "rate", self.rate, "burst", TBF_BURST, "latency", TBF_LATENCY],
                         f"tc qdisc add tbf rate {self.rate} on {dev} in {where}")
            _run(["ip", "-n", sw, "link", "set", port, "up"], f"ip link set {port} up")
            _run(["ip", "-n", ns, "link", "set", HOST_IFACE, "up"], f"ip link set {HOST_IFACE} up")

        self.workdir = tempfile.mkdtemp(prefix=f"netns-hosts.{self.switch_ns[:-2]}.")
        self._write_agent()

    def _add_ns(self, name: str) -> None:
        self._to_delete_ns.append(name)
        try:
            _run(["ip", "netns", "add", name], f"ip netns add {name}")
        except NetnsError:
            self._to_delete_ns.remove(name)   # it may belong to someone else: never delete it
            raise

    @staticmethod
    def _port(i: int) -> str:
        return f"p{i + 1}"

    def _write_agent(self) -> None:
        """The launch agent mpirun uses instead of ssh: ``agent <host> <command words...>``.

        Like ssh it joins the words into one shell command, and runs it inside the host's
        network namespace and a fresh UTS namespace named after the host.
        """
        assert self.workdir is not None
        cases = "\n".join(
            f"  {addr}|{name}) ns={ns}; name={name} ;;"
            for addr, name, ns in zip(self.addresses, self.hostnames, self.namespaces))
        script = f"""#!/bin/sh
# netns_hosts launch agent (in place of ssh): $0 <host> <command words...>
host=$1; shift
case "$host" in
{cases}
  *) echo "netns_hosts agent: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $name && $*"
"""
        path = os.path.join(self.workdir, "agent")
        with open(path, "w") as f:
            f.write(script)
        os.chmod(path, 0o755)
        self._agent = path

    # -- use ----------------------------------------------------------------------------------

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise NetnsError("netns_hosts: this Hosts instance is closed")

    def _index(self, i: int) -> int:
        if not isinstance(i, int) or not 0 <= i < self.n:
            raise IndexError(f"host index {i!r} out of range 0..{self.n - 1}")
        return i

    def prefix(self, i: int) -> list[str]:
        """argv prefix running a command in host i's network namespace and a fresh UTS
        namespace whose host name is ``h<i+1>``: ``prefix(i) + ["python3", "x.py"]``.

        The command is exec'd (ip netns exec -> unshare -> sh -> exec), so the pid
        subprocess reports is the command's own once it runs.
        """
        i = self._index(i)
        return ["ip", "netns", "exec", self.namespaces[i], "unshare", "--uts",
                "sh", "-c", f'hostname {self.hostnames[i]} && exec "$@"', "sh"]

    def iface(self, i: int) -> str:
        """Host i's interface inside its namespace (for GLOO_SOCKET_IFNAME): ``"eth0"``."""
        self._index(i)
        return HOST_IFACE

    def hostfile(self, ranks_per_host: int) -> str:
        """Path of an OpenMPI hostfile listing every host's address with slots=ranks_per_host."""
        self._check_open()
        assert self.workdir is not None
        path = os.path.join(self.workdir, f"hostfile-{ranks_per_host}")
        with open(path, "w") as f:
            f.writelines(f"{a} slots={ranks_per_host}\n" for a in self.addresses)
        return path

    def mpirun(self, ranks_per_host: int, argv: list[str],
               extra_mca: list[str] | None = None) -> list[str]:
        """Full argv running ``argv`` as n * ranks_per_host MPI ranks, ranks_per_host per host.

        mpirun itself runs inside host 0 (``prefix(0) + ["mpirun", ...]``); the other hosts'
        daemons are started through the launch agent. Run it with ``env=self.mpirun_env()``.

        MCA settings: plm_rsh_agent=<agent>, plm_rsh_no_tree_spawn=1, pml=ob1 (so the BTLs
        below are really what carries the traffic; pml ucx would otherwise take over on
        machines with Mellanox NICs and ignore them), btl=tcp,vader,self (shared memory
        between ranks of one host, TCP between hosts), btl_tcp_if_include=<subnet>,
        oob_tcp_if_include=<subnet>.

        Args:
            ranks_per_host: slots per host (>= 1); ranks are mapped by slot (host 0 first).
            argv: the program and its arguments.
            extra_mca: ``"name=value"`` strings, each becoming ``--mca name value``; a name
                given here replaces the default above (OpenMPI rejects a parameter listed
                twice), e.g. ``["btl=tcp,self"]``.
        """
        self._check_open()
        if not isinstance(ranks_per_host, int) or ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be an int >= 1, got {ranks_per_host!r}")
        if not argv:
            raise ValueError("argv must name the program to run")
        mca: dict[str, str] = {
            "plm_rsh_agent": self._agent,
            "plm_rsh_no_tree_spawn": "1",
            "pml": "ob1",
            "btl": "tcp,vader,self",
            "btl_tcp_if_include": self.subnet,
            "oob_tcp_if_include": self.subnet,
        }
        for item in extra_mca or []:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise ValueError(f"extra_mca items must be 'name=value', got {item!r}")
            mca[name] = value
        cmd = self.prefix(0) + ["mpirun", "--hostfile", self.hostfile(ranks_per_host),
                                "-np", str(self.n * ranks_per_host), "--map-by", "slot"]
        for name, value in mca.items():
            cmd += ["--mca", name, value]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        return cmd + list(argv)

    def mpirun_env(self) -> dict[str, str]:
        """os.environ plus what mpirun needs (OMPI_ALLOW_RUN_AS_ROOT[_CONFIRM] when root)."""
        env = dict(os.environ)
        if os.geteuid() == 0:
            env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
            env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        return env

    def host_tx_bytes(self, i: int) -> int:
        """Bytes host i has sent onto its link (tx_bytes of its ``eth0``, read in its namespace)."""
        self._check_open()
        ns = self.namespaces[self._index(i)]
        out = _run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", HOST_IFACE],
                   f"ip -n {ns} -s link show")
        try:
            link = json.loads(out)[0]
            stats = link.get("stats64") or link["stats"]
            return int(stats["tx"]["bytes"])
        except (ValueError, LookupError, TypeError) as e:
            raise NetnsError(f"cannot parse interface statistics of {ns}: {e}: {out[:200]!r}") from None

    def tx_bytes(self) -> int:
        """Total bytes all hosts have sent onto their links (host -> switch direction only, so
        each inter-host byte counts once; includes Ethernet/IP/TCP headers and the odd ARP)."""
        return sum(self.host_tx_bytes(i) for i in range(self.n))

    # -- cleanup ------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the namespaces (switch first: that cuts every link) and the work directory.

        Idempotent and safe to call from a signal handler while another close() is running;
        failures are ignored (whatever is already gone stays gone). A no-op in a forked child.
        """
        if self._closed or os.getpid() != self._owner_pid:
            return
        # Switch first: destroying it destroys every veth pair even if a host namespace is
        # kept alive by a lingering process.
        order = sorted(self._to_delete_ns, key=lambda name: name != self.switch_ns)
        for name in order:
            if name in self._to_delete_ns:
                _try(["ip", "netns", "del", name])
                try:
                    self._to_delete_ns.remove(name)
                except ValueError:
                    pass                 # a nested close() (signal handler) got it first
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        self._closed = True
        with _live_lock:
            if self in _live:
                _live.remove(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Hosts(n={self.n}, rate={self.rate!r}, subnet={self.subnet!r}, {state})"


# ---------------------------------------------------------------------------------------------
# Self test.

_SERVER = r"""
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1); s.settimeout(60)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.settimeout(60)
n = 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
c.sendall(f"{n}\n".encode()); c.close()
print(n, socket.gethostname(), flush=True)
"""

_CLIENT = r"""
import socket, sys, time
size = int(sys.argv[3])
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
data = bytes(size)
t0 = time.perf_counter()
c.sendall(data); c.shutdown(socket.SHUT_WR)
got = int(c.makefile().readline())
dt = time.perf_counter() - t0
print(got, dt, socket.gethostname(), flush=True)
"""


class _Fail(Exception):
    pass


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise _Fail(msg)


def _bounded(argv: list[str], timeout: float, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
    """subprocess.run in its own session; on timeout kill the whole process group."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise _Fail(f"timed out after {timeout} s: {shlex.join(argv)}\n{err[-2000:]}") from None
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _readline(p: subprocess.Popen, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    ready = sel.select(timeout)
    sel.close()
    if not ready:
        raise _Fail(f"no output within {timeout} s from {shlex.join(p.args)}")
    return p.stdout.readline()


def _transfer(hs: Hosts, size: int) -> tuple[float, int]:
    """Send ``size`` bytes from host 1 to host 0; return (seconds, tx_bytes delta)."""
    server = subprocess.Popen(hs.prefix(0) + [sys.executable, "-c", _SERVER, hs.addresses[0]],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        line = _readline(server, 30)
        _check(line.strip().isdigit(), f"server did not print a port: {line!r}")
        port = line.strip()
        tx0 = hs.tx_bytes()
        client = _bounded(hs.prefix(1) + [sys.executable, "-c", _CLIENT, hs.addresses[0], port,
                                          str(size)], timeout=60)
        _check(client.returncode == 0, f"client failed: {client.stderr.strip()}")
        tx1 = hs.tx_bytes()
        out, err = server.communicate(timeout=30)
        _check(server.returncode == 0, f"server failed: {err.strip()}")
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    got, dt, client_host = client.stdout.split()
    srv_n, srv_host = out.split()
    _check(int(got) == size and int(srv_n) == size, f"server received {srv_n} of {size} bytes")
    _check((client_host, srv_host) == ("h2", "h1"),
           f"host names in prefix(): client {client_host!r}, server {srv_host!r} (want h2, h1)")
    return float(dt), tx1 - tx0


def _ours(prefix: str) -> list[str]:
    return [n for n in _netns_names() if n.startswith(prefix)]


def _selftest() -> None:
    t_start = time.monotonic()
    mine = f"{_NAME_PREFIX}{os.getpid()}x"
    size = 5 * 1024 * 1024

    # 1. Shaped: 2 hosts at 100mbit.
    with Hosts(2, "100mbit", tag="st") as hs:
        dt, dtx = _transfer(hs, size)
        mbit = size * 8 / dt / 1e6
        print(f"[shaped 100mbit] {size} B from h2 to h1 in {dt:.3f} s = {mbit:.1f} Mbit/s; "
              f"tx_bytes delta {dtx} B ({dtx / size:.3f} x payload)")
        _check(dtx >= size, f"tx_bytes delta {dtx} < payload {size}")
        _check(60 <= mbit <= 130, f"shaped throughput {mbit:.1f} Mbit/s is not close to 100")
        shaped = mbit

    # 2. Unshaped.
    with Hosts(2, None, tag="st") as hs:
        dt, dtx = _transfer(hs, size)
        mbit = size * 8 / dt / 1e6
        print(f"[unshaped]       {size} B from h2 to h1 in {dt:.3f} s = {mbit:.1f} Mbit/s; "
              f"tx_bytes delta {dtx} B ({dtx / size:.3f} x payload)")
        _check(dtx >= size, f"tx_bytes delta {dtx} < payload {size}")
        _check(mbit > 3 * shaped, f"unshaped {mbit:.1f} Mbit/s is not much faster than shaped")

    # 3. mpirun across 4 hosts, 1 and 2 ranks per host.
    with Hosts(4, "1gbit", tag="st") as hs:
        for rph in (1, 2):
            argv = hs.mpirun(rph, ["hostname"])
            r = _bounded(argv, timeout=120, env=hs.mpirun_env())
            _check(r.returncode == 0, f"mpirun (ranks_per_host={rph}) exit {r.returncode}:\n"
                                      f"{r.stderr.strip()[-3000:]}")
            lines = r.stdout.split()
            want = sorted(f"h{i + 1}" for i in range(hs.n) for _ in range(rph))
            print(f"[mpirun {rph}/host] " + " ".join(lines))
            _check(sorted(lines) == want, f"mpirun hostname printed {lines}, want {want}")

    # 4. Failure halfway: a bad rate is rejected by tc and nothing is left behind.
    try:
        Hosts(2, "12parsecs", tag="st")
        raise _Fail("a bogus rate was accepted")
    except NetnsError as e:
        print(f"[bad rate]       NetnsError: {str(e).splitlines()[0][:110]}")

    # 5. SIGTERM / SIGINT in a process holding hosts: it cleans up and dies by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_hold"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            names = json.loads(_readline(p, 60))
            _check(all(n in _netns_names() for n in names), "hold child: namespaces missing")
            p.send_signal(sig)
            p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        left = [n for n in _netns_names() if n in names]
        print(f"[{sig.name}]        child exit {p.returncode}, "
              f"{len(names)} namespaces before, left after: {left}")
        _check(p.returncode == -sig, f"child did not die by {sig.name}: {p.returncode}")
        _check(not left, f"namespaces left after {sig.name}: {left}")

    left = _ours(mine)
    _check(not left, f"namespaces left behind: {left}")
    print(f"[cleanup]        ip netns list has none of ours; selftest OK in "
          f"{time.monotonic() - t_start:.1f} s")


def _hold() -> None:
    """Selftest helper: create hosts, print their namespace names, wait to be signalled."""
    hs = Hosts(2, "1gbit", tag="hold")
    print(json.dumps(hs.namespaces + [hs.switch_ns]), flush=True)
    time.sleep(60)
    hs.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cmd = args[0] if args else ""
    if cmd == "selftest":
        try:
            _selftest()
        except (_Fail, NetnsError) as e:
            print(f"netns_hosts selftest FAILED: {e}", file=sys.stderr)
            return 1
        return 0
    if cmd == "cleanup":
        removed = remove_stale()
        print("removed: " + (" ".join(removed) if removed else "nothing"))
        return 0
    if cmd == "_hold":
        _hold()
        return 0
    print(__doc__.split("\n\n")[0] + "\n\nusage: netns_hosts.py selftest | cleanup",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
