"""Reading and writing topology files (schema: :mod:`topology.topofile`'s docstring).

Units at the edge: bandwidths in GB/s (1e9 B/s), latencies in µs; SI inside.
"""

from __future__ import annotations

import datetime
import math
import os
from typing import Any, Mapping

from configurator.core import jsonout
from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.units import GB, US
from topology.topofile import (FORMAT, VERSION, CollectiveMeasurement, LinkMeasurement,
                               MissingMeasurement, Topology, check_policy)


def _gbps(x: float) -> float:
    return x / GB


def _opt(x, scale):
    return None if x is None else x / scale


def topology_to_dict(topo: Topology) -> dict[str, Any]:
    """The documented file schema (units at the edge: GB/s, µs) as plain dicts and lists."""
    links = []
    for l in topo.links:
        d = dict(src=l.src, dst=l.dst, src_gpu=l.src_gpu, dst_gpu=l.dst_gpu,
                 bandwidth_GBps=_gbps(l.bandwidth_Bps), latency_us=_opt(l.latency_s, US),
                 link_class=l.link_class, message_bytes=l.message_bytes, method=l.method,
                 timestamp=l.timestamp)
        if l.samples_Bps:
            d["samples_GBps"] = [_gbps(s) for s in l.samples_Bps]
        if l.gpus_per_host is not None:
            d["gpus_per_host"] = l.gpus_per_host
        if l.rails_used is not None:
            d["rails_used"] = l.rails_used
        links.append(d)
    return dict(
        format=FORMAT, version=VERSION, hosts=list(topo.hosts),
        gpus_per_host=topo.gpus_per_host, **({"gpu_name": topo.gpu_name} if topo.gpu_name
                                             else {}),
        merge_policy=topo.merge_policy, links=links,
        collectives=[dict(hosts=list(c.hosts), gpus_per_host=c.gpus_per_host, op=c.op,
                          busbw_GBps=_gbps(c.busbw_Bps), latency_us=_opt(c.latency_s, US),
                          message_bytes=c.message_bytes,
                          method=c.method, timestamp=c.timestamp) for c in topo.collectives],
        missing=[dict(src=m.src, dst=m.dst, reason=m.reason) for m in topo.missing],
        warnings=list(topo.warnings))


def _pos_float(field: str, value: Any) -> float:
    """validate.positive_float, also turning an integer too large for a float into InputError."""
    try:
        return v.positive_float(field, value)
    except OverflowError:
        raise InputError(field, value, "must be a positive finite number") from None


def _pos_int(field: str, value: Any) -> int:
    """validate.positive_int, also rejecting inf/nan cleanly."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(field, value, "must be a positive integer")
    return v.positive_int(field, value)


def _str(field: str, value: Any, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if optional and isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()  # YAML reads an unquoted ISO-8601 timestamp as a date
    if not isinstance(value, str) or not value:
        raise InputError(field, value, "must be a non-empty string")
    return value


def _gpu_index(field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(field, value, "must be a GPU index (integer >= 0) or null")
    return value


def _list(field: str, value: Any) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(field, type(value).__name__, "must be a list")
    return value


def _opt_pos(field: str, value: Any, scale: float = 1.0) -> float | None:
    return None if value is None else _pos_float(field, value) * scale


def _opt_int(field: str, value: Any) -> int | None:
    return None if value is None else _pos_int(field, value)


LINK_KEYS = ("src", "dst", "src_gpu", "dst_gpu", "bandwidth_GBps", "latency_us", "link_class",
             "message_bytes", "method", "timestamp")
LINK_OPTIONAL = ("samples_GBps", "gpus_per_host", "rails_used")
COLL_KEYS = ("hosts", "gpus_per_host", "op", "busbw_GBps", "message_bytes", "method",
             "timestamp")
COLL_OPTIONAL = ("latency_us",)
TOPO_KEYS = ("hosts", "links")
TOPO_OPTIONAL = ("format", "version", "gpus_per_host", "gpu_name", "merge_policy",
                 "collectives", "missing", "warnings")


def topology_from_dict(data: Mapping[str, Any], where: str = "topology") -> Topology:
    """Parse the documented schema; InputError names the offending field (``links[3].src``)."""
    v.exact_keys(where, data, TOPO_KEYS, TOPO_OPTIONAL)
    if data.get("format", FORMAT) != FORMAT:
        raise InputError(f"{where}.format", data["format"], f"must be {FORMAT!r}")
    if data.get("version", VERSION) != VERSION:
        raise InputError(f"{where}.version", data["version"], f"must be {VERSION}")
    hosts = tuple(_str(f"{where}.hosts[{i}]", h) for i, h in enumerate(_list(f"{where}.hosts",
                                                                           data["hosts"])))
    if not hosts:
        raise InputError(f"{where}.hosts", [], "must name at least one host: a topology with "
                                               "no host measures nothing")
    if len(set(hosts)) != len(hosts):
        raise InputError(f"{where}.hosts", list(hosts), "host names must be unique")
    known = set(hosts)

    def host(field, value):
        value = _str(field, value)
        if value not in known:
            raise InputError(field, value, "not one of the topology's hosts")
        return value

    links = []
    for i, d in enumerate(_list(f"{where}.links", data["links"])):
        f = f"{where}.links[{i}]"
        v.exact_keys(f, d, LINK_KEYS, LINK_OPTIONAL)
        sg = _gpu_index(f"{f}.src_gpu", d["src_gpu"])
        dg = _gpu_index(f"{f}.dst_gpu", d["dst_gpu"])
        if (sg is None) != (dg is None):
            raise InputError(f"{f}.src_gpu", sg,
                             "src_gpu and dst_gpu must both be set or both null")
        samples = tuple(_pos_float(f"{f}.samples_GBps[{j}]", s) * GB
                        for j, s in enumerate(_list(f"{f}.samples_GBps", d.get("samples_GBps"))))
        links.append(LinkMeasurement(
            src=host(f"{f}.src", d["src"]), dst=host(f"{f}.dst", d["dst"]), src_gpu=sg,
            dst_gpu=dg, bandwidth_Bps=_pos_float(f"{f}.bandwidth_GBps",
                                                       d["bandwidth_GBps"]) * GB,
            latency_s=_opt_pos(f"{f}.latency_us", d["latency_us"], US),
            link_class=_str(f"{f}.link_class", d["link_class"]),
            message_bytes=_opt_int(f"{f}.message_bytes", d["message_bytes"]),
            method=_str(f"{f}.method", d["method"]),
            timestamp=_str(f"{f}.timestamp", d["timestamp"], optional=True),
            samples_Bps=samples, gpus_per_host=_opt_int(f"{f}.gpus_per_host",
                                                        d.get("gpus_per_host")),
            rails_used=_opt_int(f"{f}.rails_used", d.get("rails_used"))))
    colls = []
    for i, d in enumerate(_list(f"{where}.collectives", data.get("collectives"))):
        f = f"{where}.collectives[{i}]"
        v.exact_keys(f, d, COLL_KEYS, COLL_OPTIONAL)
        colls.append(CollectiveMeasurement(
            hosts=tuple(host(f"{f}.hosts[{j}]", h)
                        for j, h in enumerate(_list(f"{f}.hosts", d["hosts"]))),
            gpus_per_host=_pos_int(f"{f}.gpus_per_host", d["gpus_per_host"]),
            op=_str(f"{f}.op", d["op"]),
            busbw_Bps=_pos_float(f"{f}.busbw_GBps", d["busbw_GBps"]) * GB,
            latency_s=_opt_pos(f"{f}.latency_us", d.get("latency_us"), US),
            message_bytes=_opt_int(f"{f}.message_bytes", d["message_bytes"]),
            method=_str(f"{f}.method", d["method"]),
            timestamp=_str(f"{f}.timestamp", d["timestamp"], optional=True)))
    missing = []
    for i, d in enumerate(_list(f"{where}.missing", data.get("missing"))):
        f = f"{where}.missing[{i}]"
        v.exact_keys(f, d, ("src", "dst", "reason"), ())
        missing.append(MissingMeasurement(src=host(f"{f}.src", d["src"]),
                                          dst=host(f"{f}.dst", d["dst"]),
                                          reason=_str(f"{f}.reason", d["reason"])))
    warnings = tuple(_str(f"{where}.warnings[{i}]", w)
                     for i, w in enumerate(_list(f"{where}.warnings", data.get("warnings"))))
    gph = data.get("gpus_per_host")
    name = data.get("gpu_name")
    return Topology(hosts=hosts, gpus_per_host=_opt_int(f"{where}.gpus_per_host", gph),
                    links=tuple(links), collectives=tuple(colls), missing=tuple(missing),
                    merge_policy=check_policy(data.get("merge_policy", "min")),
                    warnings=warnings,
                    gpu_name=None if name is None else v.display_name(f"{where}.gpu_name", name))



def load_topology(path: str | os.PathLike) -> Topology:
    """Read a topology file (JSON when it starts with ``{``, else YAML).

    Raises InputError (field ``topology`` or the offending key) when the file cannot be read,
    is not UTF-8 text, is malformed or nested too deeply, or breaks the schema.
    """
    path = os.fspath(path)
    key = _file_key(path)
    if key is None:
        return _read_topology(path)
    if key not in _LOADED:
        while len(_LOADED) >= _LOADED_MAX:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = _read_topology(path)
    return _LOADED[key]


#: Topology files read in this process, by :func:`_file_key`: the search, its placement
#: and the audit all load the same file once (a :class:`Topology` is immutable, so they
#: share it); a changed file has another key.
_LOADED: dict[tuple, Topology] = {}
_LOADED_MAX = 8   # files kept (a search, its placement and the audit share one; set by hand)


def _file_key(path: str) -> tuple | None:
    """(real path, inode, size, modification time) of an existing file, else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns


def _read_topology(path: str) -> Topology:
    text = v.read_text_file("topology", path)
    data = v.parse_mapping_text("topology", path, text, as_json=text.lstrip().startswith("{"))
    return topology_from_dict(data)


def dumps_topology(topo: Topology, fmt: str = "json") -> str:
    """The file text: ``fmt`` ``json`` (indented) or ``yaml``."""
    data = topology_to_dict(topo)
    if fmt == "json":
        return jsonout.dumps(data, indent=1) + "\n"
    import yaml

    return yaml.safe_dump(data, sort_keys=False, width=100)


def save_topology(topo: Topology, path: str | os.PathLike, force: bool = False) -> None:
    """Write ``topo`` to ``path`` (JSON if it ends in ``.json``, else YAML), atomically.

    Raises InputError (field ``output``) if ``path`` exists and ``force`` is false, or if it
    cannot be written.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not force:
        raise InputError("out", path, "file exists; pass --force to overwrite")
    text = dumps_topology(topo, "json" if path.endswith(".json") else "yaml")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise InputError("out", path, f"cannot write file ({err.strerror})") from None
    key = _file_key(path)
    if key is not None:             # what load_topology would read back
        _LOADED[key] = topo
