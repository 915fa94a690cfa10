"""A real multi-host probe on one machine: 4 network namespaces ("hosts") on a bridge, every
host's egress shaped to FAST_MBIT except the link host1 ↔ host3 (SLOW_MBIT in both directions,
htb classes per destination; egress only, as netem and ingress qdiscs may be missing from the
kernel). torchrun runs once per namespace with gloo; the probe must find that link, near its
configured rate, and the audit must flag it.

Needs root (CAP_NET_ADMIN), ``ip`` and ``tc`` (Debian package iproute2) and the kernel's
veth, bridge and htb support; skips with the reason otherwise. Everything is created inside
namespaces named ``cfgtest-<pid>-*`` and removed afterwards, even on failure.
"""

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topology.topofile_io import load_topology

pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[1]
HOSTS = 4
FAST_MBIT, SLOW_MBIT = 400, 100
SLOW_PAIR = (1, 3)
SIZE_MB = 25              # 0.5 s per message on a fast link, 2 s on the slow one
SUBNET = "10.123.45"      # only inside the test's own namespaces
IFACE = "cfg0"            # the host end of each veth (same name in every host namespace)
PORT = 29400              # the namespaces are new and empty, so no port can clash
# A shaped link is a hard cap: a reading above it (beyond timer noise) is a probe error. Below
# it, a loaded 2-core machine running four torchrun agents and their workers reads 5-25 %
# low (TCP/Ethernet headers alone cost 4.5 %); a wrong unit, direction or pairing is off by a
# factor of 2 or more, so these bounds still catch every such bug.
ABOVE_CAP = 0.05
BELOW_CAP = 0.40
SLOW_RATIO_TOLERANCE = 0.30   # median fast / median slow vs FAST_MBIT / SLOW_MBIT
RUN_TIMEOUT_S = 150
FAIL_GRACE_S = 20
STALE_AFTER_S = 900
PREFIX = f"cfgtest-{os.getpid()}"
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE", "CONFIGURATOR_PROBE_HOSTNAME")


def sh(*argv, check=True):
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and res.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")
    return res


def _remove_stale_namespaces():
    """Namespaces left by an earlier run of this test that died before its clean-up: the
    creating process is gone and the namespace is older than a run can last."""
    for name in sh("ip", "netns", "list", check=False).stdout.split():
        m = re.fullmatch(r"cfgtest-(\d+)-\w+", name)
        path = Path("/run/netns") / name
        try:
            age_s = time.time() - path.stat().st_mtime
        except OSError:
            continue
        if m and not Path(f"/proc/{m.group(1)}").exists() and age_s > STALE_AFTER_S:
            sh("ip", "netns", "del", name, check=False)


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL every process inside our namespace ``ns`` (torchrun starts its workers in new
    sessions, so killing the launcher's process group does not reach them)."""
    for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _shape(ns: str, rates: dict[str, int], default_mbit: int):
    """htb on the host's egress: ``default_mbit``, or ``rates[dst ip]`` toward some hosts."""
    tc = ("ip", "netns", "exec", ns, "tc")
    sh(*tc, "qdisc", "add", "dev", IFACE, "root", "handle", "1:", "htb", "default", "10")
    sh(*tc, "class", "add", "dev", IFACE, "parent", "1:", "classid", "1:10", "htb", "rate",
       f"{default_mbit}mbit", "ceil", f"{default_mbit}mbit", "quantum", "60000")
    for k, (ip, mbit) in enumerate(rates.items()):
        cls = f"1:{20 + k}"
        sh(*tc, "class", "add", "dev", IFACE, "parent", "1:", "classid", cls, "htb", "rate",
           f"{mbit}mbit", "ceil", f"{mbit}mbit", "quantum", "60000")
        sh(*tc, "filter", "add", "dev", IFACE, "parent", "1:", "protocol", "ip", "prio", "1",
           "u32", "match", "ip", "dst", f"{ip}/32", "flowid", cls)


@pytest.fixture
def cluster():
    """Namespaces ``PREFIX-h<i>`` (address SUBNET.<i+1>) on a bridge in ``PREFIX-sw``."""
    if os.geteuid() != 0:
        pytest.skip("needs root (CAP_NET_ADMIN) to create network namespaces")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            pytest.skip(f"`{tool}` not found (Debian package iproute2)")
    _remove_stale_namespaces()
    created = []
    try:
        for name in [f"{PREFIX}-sw"] + [f"{PREFIX}-h{i}" for i in range(HOSTS)]:
            res = sh("ip", "netns", "add", name, check=False)
            if res.returncode:
                pytest.skip(f"cannot create a network namespace: {res.stderr.strip()}")
            created.append(name)
        sw = f"{PREFIX}-sw"
        try:
            sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", sw, "link", "set", "br0", "up")
            for i in range(HOSTS):
                ns = f"{PREFIX}-h{i}"
                sh("ip", "link", "add", IFACE, "netns", ns, "type", "veth", "peer", "name",
                   f"p{i}", "netns", sw)
                sh("ip", "-n", sw, "link", "set", f"p{i}", "master", "br0")
                sh("ip", "-n", sw, "link", "set", f"p{i}", "up")
                sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", IFACE)
                sh("ip", "-n", ns, "link", "set", IFACE, "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "netns", "exec", f"{PREFIX}-h0", "ip", "-brief", "addr", "show", IFACE)
            for i in range(HOSTS):
                slow = {f"{SUBNET}.{j + 1}": SLOW_MBIT for j in SLOW_PAIR
                        if i in SLOW_PAIR and j != i}
                _shape(f"{PREFIX}-h{i}", slow, FAST_MBIT)
        except RuntimeError as err:  # e.g. no veth/bridge/htb in this kernel
            pytest.skip(f"cannot build the emulated network: {err}")
        yield [f"{PREFIX}-h{i}" for i in range(HOSTS)]
    finally:
        for name in reversed(created):
            _kill_namespace_processes(name)
            sh("ip", "netns", "del", name, check=False)


def _run_probe(namespaces, out: Path):
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    procs = []
    try:
        for i, ns in enumerate(namespaces):
            argv = ["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={IFACE}",
                    f"CONFIGURATOR_PROBE_HOSTNAME=host{i}", sys.executable, "-m",
                    "torch.distributed.run", "--nnodes", str(HOSTS), "--nproc-per-node", "1",
                    "--node-rank", str(i), "--master-addr", f"{SUBNET}.1", "--master-port",
                    str(PORT), "--rdzv-conf", "timeout=90", "-m", "topology.probe",
                    "--out", str(out), "--backend", "gloo", "--size-mb", str(SIZE_MB),
                    "--iters", "3", "--warmup", "1", "--timeout-s", "60"]
            with open(out.parent / f"host{i}.log", "w") as log:  # no pipe to fill up
                procs.append(subprocess.Popen(argv, env=env, cwd=REPO, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() for p in procs):  # one failed: the rest get a short grace
                deadline = min(deadline, time.monotonic() + FAIL_GRACE_S)
            time.sleep(0.2)
    finally:
        for ns in namespaces:  # leftover torchrun agents and workers
            _kill_namespace_processes(ns)
        for p in procs:
            p.wait()
    outs = [(out.parent / f"host{i}.log").read_text() for i in range(len(procs))]
    return [p.returncode for p in procs], outs


def test_probe_finds_the_shaped_link(cluster, tmp_path):
    out = tmp_path / "topo.json"
    codes, outs = _run_probe(cluster, out)
    assert codes == [0] * HOSTS, "\n".join(f"--- host{i} (exit {c}):\n{o[-3000:]}"
                                            for i, (c, o) in enumerate(zip(codes, outs)))
    topo = load_topology(out)
    assert topo.hosts == tuple(f"host{i}" for i in range(HOSTS)) and not topo.missing
    links = {(l.src, l.dst): l for l in topo.links}
    assert len(links) == HOSTS * (HOSTS - 1)
    slow = {(f"host{a}", f"host{b}") for a in SLOW_PAIR for b in SLOW_PAIR if a != b}
    measured = {k: l.bandwidth_Bps for k, l in links.items()}
    report = ", ".join(f"{a}->{b} {bw / 1e6:.2f}" for (a, b), bw in sorted(measured.items()))
    print(f"measured MB/s (configured fast {FAST_MBIT / 8:.1f}, slow {SLOW_MBIT / 8:.1f}): "
          f"{report}")
    # the shaped link is the slowest, in both directions
    assert set(sorted(measured, key=measured.get)[:2]) == slow, report
    for key, bw in measured.items():
        rate_Bps = (SLOW_MBIT if key in slow else FAST_MBIT) * 1e6 / 8
        assert 1 - BELOW_CAP <= bw / rate_Bps <= 1 + ABOVE_CAP, (key, bw, rate_Bps, report)
        assert len(links[key].samples_Bps) == 3
    fast_med = statistics.median(bw for k, bw in measured.items() if k not in slow)
    slow_med = statistics.median(bw for k, bw in measured.items() if k in slow)
    ratio = (fast_med / slow_med) / (FAST_MBIT / SLOW_MBIT)
    assert abs(ratio - 1) <= SLOW_RATIO_TOLERANCE, (fast_med, slow_med, report)

    audit = pytest.importorskip("topology.audit")
    rep = audit.audit(topo)
    flagged = {frozenset((f.src, f.dst)) for f in rep.flagged_links if f.kind == "slow"}
    assert flagged == {frozenset(slow.pop())}, rep.flagged_links   # that pair, and only it
