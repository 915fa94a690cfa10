"""Import ``nvidia-smi topo -m`` output: intra-node GPU↔GPU links at nominal (data-sheet) rates.

The matrix has a header row of devices (``GPU0 … GPU7``, then NICs as ``NIC0 …`` with a
``NIC Legend`` below on newer drivers, or ``mlx5_0 …`` on older ones) followed by ``CPU
Affinity``, ``NUMA Affinity`` and, on newer drivers, ``GPU NUMA ID``; one row per device;
cells are tab-separated connection codes (parsed by whitespace, so pasted copies work too).
ANSI colour codes are stripped. Legend (nvidia-smi; NVML ``nvmlGpuTopologyLevel_t``):

====== ============ ===================================================================
code   link_class   nominal rate per direction (bytes/s), source
====== ============ ===================================================================
X      (self)       no link
NV#    nvlink       # × 25 GB/s: NVLink 2/3/4 carry 25 GB/s per link per direction
                    (NVIDIA A100 data sheet: 12 links, 600 GB/s bidirectional; H100 SXM
                    data sheet: 18 links, 900 GB/s bidirectional)
PIX    pcie-pix     one x16 PCIe link: at most one PCIe bridge on the path
PXB    pcie-pxb     one x16 PCIe link: several bridges, no host bridge
PHB    pcie-phb     one x16 PCIe link, through the CPU's PCIe host bridge
NODE   pcie-node    one x16 PCIe link, across host bridges within a NUMA node
SYS    pcie-sys     one x16 PCIe link, across the SMP interconnect (QPI/UPI/xGMI), which
                    may well be slower; topo -m does not tell its rate
====== ============ ===================================================================

PCIe x16 per direction: lanes × rate × 128/130 (encoding) / 8 — Gen4 16 GT/s → 31.5 GB/s,
Gen5 32 GT/s → 63.0 GB/s (PCI-SIG base specifications 4.0/5.0; NVIDIA's data sheets round to
64 and 128 GB/s bidirectional). The generation defaults to 5 when the matrix shows NV18 or
more (NVLink4, H100/H200 class) and 4 otherwise; pass ``pcie_gen`` to override.

Records carry ``method = "nvidia-smi topo -m (nominal)"``: rates from the data sheet, not
measurements. NIC rows and columns are read and checked, not turned into links.
"""

from __future__ import annotations

import re

from configurator.core.errors import InputError
from configurator.core.units import GB
from topology.topofile import LinkMeasurement, Topology

METHOD = "nvidia-smi topo -m (nominal)"
NVLINK_PER_LINK_Bps = 25 * GB
PCIE_X16_Bps = {gen: 16 * rate * 1e9 * 128 / 130 / 8 for gen, rate in
                ((3, 8), (4, 16), (5, 32), (6, 64))}
PCIE_CLASSES = {"PIX": "pcie-pix", "PXB": "pcie-pxb", "PHB": "pcie-phb", "NODE": "pcie-node",
                "SYS": "pcie-sys"}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE = re.compile(r"^[A-Za-z][\w.-]*\d$|^mlx\d+_\d+$")
_NV = re.compile(r"^NV(\d+)$")


def looks_like_topo_matrix(text: str) -> bool:
    """True when ``text`` holds a ``GPU0 …`` header followed by a ``GPU0`` row."""
    return _header(_ANSI.sub("", text).splitlines()) is not None


def _header(lines: list[str]) -> tuple[int, list[str]] | None:
    for i, line in enumerate(lines):
        toks = line.split()
        if not toks or toks[0] != "GPU0":
            continue
        devices = []
        for t in toks:
            if not _DEVICE.match(t):
                break
            devices.append(t)
        if len(devices) == len(toks) or toks[len(devices)] in ("CPU", "NUMA", "GPU"):
            if any(l.split()[:1] == ["GPU0"] for l in lines[i + 1:]):
                return i, devices
    return None


def parse_topo_matrix(text: str, host: str, pcie_gen: int | None = None) -> Topology:
    """GPU↔GPU links of one host from ``nvidia-smi topo -m`` text.

    Returns a :class:`Topology` with ``n·(n-1)`` intra-node links (n GPUs), bandwidth_Bps
    nominal per direction (module table). Unknown or inconsistent cells become warnings.
    Raises InputError if ``text`` holds no matrix or ``pcie_gen`` is unknown.
    """
    if pcie_gen is not None and pcie_gen not in PCIE_X16_Bps:
        raise InputError("pcie_gen", pcie_gen, f"must be one of {sorted(PCIE_X16_Bps)}")
    lines = _ANSI.sub("", text).splitlines()
    found = _header(lines)
    if found is None:
        raise InputError("nvidia-smi", host, "no 'nvidia-smi topo -m' matrix (GPU0 header "
                                             "and rows) found")
    start, devices = found
    gpus = [d for d in devices if re.fullmatch(r"GPU\d+", d)]
    warnings: list[str] = []
    cells: dict[str, list[str]] = {}
    for line in lines[start + 1:]:
        toks = line.split()
        if not toks:
            continue
        if toks[0].rstrip(":") in ("Legend", "NIC"):
            break
        if toks[0] not in devices:
            warnings.append(f"{host}: unexpected matrix row {toks[0]!r} skipped")
            continue
        if len(toks) < 1 + len(devices):
            warnings.append(f"{host}: row {toks[0]} has {len(toks) - 1} cells for "
                            f"{len(devices)} devices; missing cells skipped")
        cells[toks[0]] = toks[1:1 + len(devices)]
    for g in gpus:
        if g not in cells:
            warnings.append(f"{host}: no row for {g}")
    if pcie_gen is None:
        nv = [int(m.group(1)) for row in cells.values() for c in row if (m := _NV.match(c))]
        pcie_gen = 5 if nv and max(nv) >= 18 else 4
    links = []
    for a in gpus:
        row = cells.get(a, [])
        for j, b in enumerate(devices):
            if not b.startswith("GPU") or b not in gpus or j >= len(row):
                continue
            code = row[j]
            if a == b:
                if code != "X":
                    warnings.append(f"{host}: {a}↔{b} should be X, is {code!r}")
                continue
            other = cells.get(b, [])
            ia = devices.index(a)
            if ia < len(other) and other[ia] != code:
                warnings.append(f"{host}: {a}→{b} is {code} but {b}→{a} is {other[ia]}")
            m = _NV.match(code)
            if m and int(m.group(1)) > 0:
                bw, cls = int(m.group(1)) * NVLINK_PER_LINK_Bps, "nvlink"
            elif code in PCIE_CLASSES:
                bw, cls = PCIE_X16_Bps[pcie_gen], PCIE_CLASSES[code]
            else:
                warnings.append(f"{host}: {a}→{b} has unknown code {code!r}; skipped")
                continue
            links.append(LinkMeasurement(
                src=host, dst=host, src_gpu=int(a[3:]), dst_gpu=int(b[3:]), bandwidth_Bps=bw,
                latency_s=None, link_class=cls, message_bytes=None, method=METHOD,
                timestamp=None))
    return Topology(hosts=(host,), gpus_per_host=len(gpus) or None, links=tuple(links),
                    warnings=tuple(warnings))
