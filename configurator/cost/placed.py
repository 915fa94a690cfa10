"""One plan on placed ranks: every group's own links, every stage's own time, the exact
pipeline schedule.

Where :func:`configurator.cost.iteration.iteration_time` prices every plan in closed form
(every stage as slow as the slowest, every group as slow as its slowest hop), this module
prices ONE plan under a given placement (node rank → host, local rank → GPU index) on the
cluster's measured links:

* each data-parallel replica ``d`` is a pipeline; its stage ``s`` runs its layers'
  compute plus the tensor- and context-parallel collectives of *its* groups (the slowest
  of its cp tensor groups, the slowest of its tp context rings: they run in lock-step);
* the sends between stages ``s → s+1`` of replica ``d`` go over the links its ranks sit on
  (tp·cp parallel sends, the slowest pair sets the time), forward and backward directions
  each with their own link figures. Interleaved schedules overlap them with compute
  (Megatron's ``overlap_p2p_comm``, on by default with interleaving): a send delays only
  its receiver. 1F1B batches each send with the next receive and waits (the option is
  forced off without interleaving, ``megatron/training/arguments.py``): the sender is busy
  for the send;
* every replica's schedule is simulated (:func:`configurator.cost.schedule_sim.simulate`,
  1F1B or interleaved in Megatron's order), the first stage carrying the embedding and the
  last the logits and loss;
* after its last backward a stage reduces its gradients over its own dp·cp rings (the
  slowest of its tp rings), exposed as the plan's overlap flags say, then all ranks take
  the optimizer step.

The terms themselves (per-layer terms, :data:`~configurator.cost.iteration.LAYER_TERMS`;
collective counts, overlap windows, extras, send and optimizer times) are the closed form's
functions (:mod:`configurator.cost.iteration`), called here with each group's own figures, so
on a uniform cluster the two agree: ``tests/test_placed.py`` draws plans from the search's
enumeration (dense and MoE, 1F1B and interleaved, even and uneven splits, cp > 1) and finds
one pipeline stage priced alike to 1e-9 and even splits within 1 % (the schedule never
slower); uneven splits differ by what the closed form simplifies on purpose (that test's
docstring gives the measured sizes).

Rank order: Megatron's ``tp-cp-ep-dp-pp`` (:mod:`topology.rank_order`), ``ep = 1``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from configurator.core.plan_batch import PlanBatch
from configurator.core.model import ModelSpec
from configurator.cost.compute import layer_costs
from configurator.core.layers import chunk_layer_counts, rank_layer_counts
from configurator.core.rows import distinct_rows
from configurator.cost.communication import expert_comm_figures
from configurator.cost.iteration import (dp_exposed_s, dp_windows_s, layer_pass_s,
                                         layer_type_times, layers_terms_s, optimizer_s,
                                         p2p_message_s, stage_extras_s, tied_embedding_s,
                                         backward_overlap_s)
from configurator.cost.schedule_sim import SimResult, simulate
from memory_model.params import stage_parameter_split, stage_parameter_tensors
from topology.group_figures import domain_members, host_ring_figures, ring_figures


#: Bytes of distinct replica rows whose simulated makespan a :class:`PlacedPlan` keeps.
MEMO_BYTES = 32 << 20
#: Ranks (placements × world size) whose rank → GPU maps :meth:`PlacedPlan.times` prices
#: in one pass; more placements are priced in slices of this size.
BATCH_GPUS = 1 << 18


@dataclass(frozen=True)
class PlacedTime:
    """The simulated iteration of one plan under one placement (seconds).

    ``iteration_time_s`` = slowest (stage finish + exposed data-parallel time) + optimizer.
    ``stage_fwd_s``/``stage_bwd_s``: ``[dp, pp, vp]`` one microbatch's chunk times;
    ``p2p_fwd_s``/``p2p_bwd_s``: ``[dp, pp]`` send times per boundary (index ``s``: between
    rank ``s`` and ``(s+1) % pp``); ``dp_tail_s``: ``[pp]`` exposed gradient reduction per
    stage; ``optimizer_s``; ``critical_replica``: the replica that sets the pace;
    ``sim``: the recorded simulation of that replica with ``record=True``, else None;
    ``num_microbatches``: the plan's microbatches per iteration."""

    iteration_time_s: float
    stage_fwd_s: np.ndarray
    stage_bwd_s: np.ndarray
    p2p_fwd_s: np.ndarray
    p2p_bwd_s: np.ndarray
    dp_tail_s: np.ndarray
    optimizer_s: float
    critical_replica: int
    sim: SimResult | None
    num_microbatches: int

    def stage_times(self) -> list[dict]:
        """Per pipeline stage of the replica that sets the pace, seconds per iteration:
        ``forward_s`` and ``backward_s`` (every microbatch through all of the stage's
        chunks, sends a 1F1B sender waits for included), ``busy_s`` their sum,
        ``dp_exposed_s`` the gradient reduction after its last backward, and ``idle_s``
        the rest of the iteration before the optimizer step (waiting for other stages)."""
        w, m = self.critical_replica, self.num_microbatches
        makespan = self.iteration_time_s - self.optimizer_s
        out = []
        for s in range(self.stage_fwd_s.shape[1]):
            f = m * float(self.stage_fwd_s[w, s].sum())
            b = m * float(self.stage_bwd_s[w, s].sum())
            tail = float(self.dp_tail_s[s])
            out.append({"stage": s, "forward_s": f, "backward_s": b, "busy_s": f + b,
                        "dp_exposed_s": tail, "idle_s": max(makespan - f - b - tail, 0.0)})
        return out

    def recorded(self) -> SimResult:
        """The schedule of the replica that sets the pace with every op's times and the
        critical path (what a Gantt chart draws): :attr:`sim`, or, when this iteration was
        priced without ``record``, that replica simulated again from the chunk, send and
        tail times kept here (no link is looked up again)."""
        if self.sim is not None:
            return self.sim
        w = self.critical_replica
        return simulate(self.stage_fwd_s[w], self.stage_bwd_s[w], self.p2p_fwd_s[w],
                        self.p2p_bwd_s[w], self.num_microbatches, tail_s=self.dp_tail_s,
                        record=True)


class PlacedPlan:
    """Prices one plan (``plans``, a :class:`PlanBatch` of one) for ``model`` on ``cluster``
    under any placement.

    Everything that does not depend on where ranks sit (layer compute, extras, message
    sizes, rank grid) is computed once here; :meth:`time` then only looks up the links of
    the given placement (:meth:`topology.cluster.Cluster.link_table`) and simulates.
    ``profile``: measured layer times (:class:`configurator.core.profile.LayerProfile`) in
    place of the analytic layer compute, or None. Raises ValueError if ``plans`` is not one
    plan or the plan needs more GPUs than ``cluster`` has.
    """

    def __init__(self, model: ModelSpec, cluster, plans: PlanBatch, profile=None):
        if len(plans) != 1:
            raise ValueError(f"PlacedPlan prices one plan, not a batch of {len(plans)}")
        self.model, self.cluster, self.c = model, cluster, plans
        G = cluster.gpus_per_node
        self.pp, self.dp, self.cp, self.tp, self.vp = (
            int(getattr(plans, k)[0]) for k in ("pp", "dp", "cp", "tp", "vp"))
        self.world_size = int(plans.world_size[0])
        self.num_microbatches = int(plans.num_microbatches[0])
        world = self.world_size
        if world % G or world > cluster.num_gpus:
            raise ValueError(f"plan of {world} GPUs does not fill whole hosts of {G} GPUs "
                             f"among the cluster's {cluster.num_gpus}")
        self.num_nodes = world // G
        self.table = cluster.link_table()
        c = plans
        self.lc = layer_costs(model, c, cluster.gpu, profile)
        pp, dp, cp, tp = self.pp, self.dp, self.cp, self.tp
        ep, etp = int(c.ep[0]), int(c.etp[0])
        # global rank grid [pp, dp, cp, tp] (rank = t + tp·(c + cp·(d + dp·s)))
        self.ranks = np.arange(world, dtype=np.int64).reshape(pp, dp, cp, tp)
        # decoder and MoE layers of each virtual stage: [pp, vp] (chunk j of rank r is
        # virtual stage j·pp + r)
        split = c.layer_split(0)
        chunks = chunk_layer_counts(model, *split).astype(float)
        self.chunk_layers, self.chunk_moe = chunks[:, :, 0], chunks[:, :, 1]
        # each rank's dense and MoE layers, [pp]
        self.stage_moe = self.chunk_moe.sum(axis=1)
        self.stage_dense = self.chunk_layers.sum(axis=1) - self.stage_moe
        counts = rank_layer_counts(model, *split)
        ne, ex = stage_parameter_split(model, tp, pp, np.arange(pp), layers=counts[:, 0],
                                       moe_layers=counts[:, 1], ep=ep, etp=etp)
        self.stage_params = np.broadcast_to(np.asarray(ne, dtype=float), (pp,)).copy()
        self.stage_expert_params = np.broadcast_to(np.asarray(ex, dtype=float), (pp,)).copy()
        # the optimizer step of the slowest stage: the same under every placement
        tensors = stage_parameter_tensors(model, pp, np.arange(pp), layers=counts[:, 0],
                                          moe_layers=counts[:, 1], ep=ep)
        self.opt_s = float(np.max(optimizer_s(c, cluster.gpu, self.stage_params,
                                              self.stage_expert_params, tensors)))
        self.expert_comm = expert_comm_figures(cluster, c)
        # On a uniform cluster a link's figures depend only on whether its GPUs share an
        # NVLink domain, which no node-granular placement changes while domains are hosts
        # (or one domain holds every host): every placement prices as Megatron's order, and
        # a group's (or send's) figures depend only on where its first rank sits within a
        # host, so each is priced once per residue (the cost no longer grows with the world
        # size).
        self.uniform = cluster.placement_invariant
        #: simulated makespan of every distinct replica row priced so far, by its bytes:
        #: placements a search tries differ in a few replicas, and only those are simulated
        self._simulated: dict[bytes, float] = {}

    # -- placement → physical GPUs ------------------------------------------------------
    def rank_gpus(self, node_hosts, gpu_order) -> np.ndarray:
        """Physical GPU index (host-major over the cluster's hosts) of every global rank:
        rank ``r`` on node rank ``n = r // G`` runs on host ``node_hosts[n]``, GPU
        ``gpu_order[n][r % G]``. Shapes ``[N]`` and ``[N, G]``; returns ``[pp, dp, cp, tp]``."""
        G = self.cluster.gpus_per_node
        nh = np.asarray(node_hosts, dtype=np.int64)
        go = np.asarray(gpu_order, dtype=np.int64)
        node, local = np.divmod(self.ranks, G)
        return nh[node] * G + go[node, local]

    # -- the time -------------------------------------------------------------------------
    def terms(self, gpus: np.ndarray) -> dict:
        """Stage and boundary times for the rank → GPU map ``gpus`` (``[pp, dp, cp, tp]``):
        ``fwd``/``bwd`` ``[dp, pp, vp]``, ``p2p_f``/``p2p_b`` ``[dp, pp]``, ``tail``
        ``[pp]``, ``opt`` (seconds; :meth:`terms_many` of one map)."""
        t = self.terms_many(np.asarray(gpus)[None])
        return {k: v if k == "opt" else v[0] for k, v in t.items()}

    def terms_many(self, gpus: np.ndarray) -> dict:
        """:meth:`terms` of ``K`` rank → GPU maps at once (``gpus`` ``[K, pp, dp, cp, tp]``):
        every array gains a leading ``K`` axis. Each figure is the same float the map alone
        gives (elementwise arithmetic and min/max over the same groups), so a batch of
        placements is priced in one pass over numpy instead of ``K`` (``opt`` stays one
        float)."""
        if self.uniform:           # every placement prices as Megatron's order
            one = self._terms_batch(self.ranks[None])
            return {k: v if k == "opt" else np.repeat(v, gpus.shape[0], axis=0)
                    for k, v in one.items()}
        return self._terms_batch(gpus)

    def _terms_batch(self, gpus: np.ndarray) -> dict:
        c, lc, model = self.c, self.lc, self.model
        pp, dp, cp, tp, vp = self.pp, self.dp, self.cp, self.tp, self.vp
        K = gpus.shape[0]
        G = self.cluster.gpus_per_node
        table_links = self.table.links

        def by_residue(first: np.ndarray, backward: np.ndarray | None = None):
            """Representatives and inverse of the rows (uniform clusters; else None):
            rows alike when their first GPU index ``first`` sits at the same place within
            a host (the rings of one call share their offsets, rank-grid rows being evenly
            spaced) and, for pairs, they point the same way (``backward``: the sends of
            one call go one stage on, or round the wrap the other way). O(rows), no sort."""
            if not self.uniform or first.size <= G:
                return None, None
            key = first % G if backward is None else first % G + G * backward
            lowest = np.full(2 * G, first.size)
            np.minimum.at(lowest, key, np.arange(first.size))
            present = np.flatnonzero(lowest < first.size)
            code = np.zeros(2 * G, dtype=np.int64)
            code[present] = np.arange(present.size)
            return lowest[present], code[key]

        def rings(rows):
            rep, inv = by_residue(rows[:, 0])
            if rep is None and self.table.host_level:
                return host_ring_figures(rows, table_links, self.cluster.gpu_domains,
                                         self.table)
            if rep is None:
                return ring_figures(rows, table_links, self.cluster.gpu_domains)
            bw, lat = ring_figures(rows[rep], table_links, self.cluster.gpu_domains)
            return bw[inv], lat[inv]

        def links(a, b):
            rep, inv = by_residue(a, b < a)
            if rep is None:
                return table_links(a, b)
            bw, lat = table_links(a[rep], b[rep])
            return bw[inv], lat[inv]

        def slowest(bw, lat, groups: int):
            """Per ``[K, pp, dp]`` cell, the slowest of its ``groups`` rows, as
            ``[K, dp, pp]`` (bandwidth: the least; latency: the most)."""
            bw, lat = bw.reshape(K, pp, dp, groups), lat.reshape(K, pp, dp, groups)
            return bw.min(axis=3).transpose(0, 2, 1), lat.max(axis=3).transpose(0, 2, 1)

        # tensor groups: [K, pp, dp, cp] rows of tp; the stage waits for its slowest
        tp_bw, tp_lat = slowest(*rings(gpus.reshape(-1, tp)), cp)            # [K, dp, pp]
        # context rings: [K, pp, dp, tp] rows of cp; their single sends (the wrap-around
        # included) and members per NVLink domain (the p2p exchange, the all-to-all)
        cp_rows = gpus.transpose(0, 1, 2, 4, 3).reshape(-1, cp)
        cp_bw, cp_lat = slowest(*rings(cp_rows), tp)
        if cp > 1:
            rep, inv = by_residue(cp_rows[:, 0])     # rows alike on a uniform cluster
            sub = cp_rows if rep is None else cp_rows[rep]
            nxt = np.roll(sub, -1, axis=1)
            fw, fl = table_links(sub.reshape(-1), nxt.reshape(-1))
            bw_, bl = table_links(nxt.reshape(-1), sub.reshape(-1))
            hop_bw = np.minimum(fw, bw_).reshape(-1, cp).min(axis=1)
            hop_lat = np.maximum(fl, bl).reshape(-1, cp).max(axis=1)
            on = domain_members(sub, self.cluster.gpu_domains)
            if rep is not None:
                hop_bw, hop_lat, on = hop_bw[inv], hop_lat[inv], on[inv]
            cp_hop_bw, cp_hop_lat = slowest(hop_bw, hop_lat, tp)
            cp_on = on.reshape(K, pp, dp, tp).min(axis=3).transpose(0, 2, 1)
        else:
            cp_hop_bw, cp_hop_lat, cp_on = cp_bw, cp_lat, 1
        # data-parallel (dp·cp) rings of each stage: [K, pp, tp] rows
        dbw, dlat = rings(gpus.transpose(0, 1, 4, 2, 3).reshape(-1, dp * cp))
        dp_bw = dbw.reshape(K, pp, tp).min(axis=2)                            # [K, pp]
        dp_lat = dlat.reshape(K, pp, tp).max(axis=2)

        types = layer_type_times(model, c, lc, dict(self.expert_comm, tp_bw=tp_bw,
                                                   tp_lat=tp_lat, cp_bw=cp_bw, cp_lat=cp_lat,
                                                   cp_hop_bw=cp_hop_bw,
                                                   cp_hop_lat=cp_hop_lat,
                                                   cp_on_node=cp_on))
        x = {k: np.broadcast_to(v, (K, dp, pp))
             for k, v in stage_extras_s(model, c, self.cluster.gpu, lc, tp_bw, tp_lat).items()}

        def chunks(back):
            """``[K, dp, pp, vp]``: each chunk's dense and MoE layers at their layer times."""
            dense_n = (self.chunk_layers - self.chunk_moe)[None, None]       # [1, 1, pp, vp]
            moe_n = self.chunk_moe[None, None]
            return (dense_n * np.broadcast_to(layer_pass_s(types["dense"], back),
                                              (K, dp, pp))[..., None]
                    + moe_n * np.broadcast_to(layer_pass_s(types["moe"], back),
                                              (K, dp, pp))[..., None])

        fwd, bwd = chunks(False), chunks(True)
        fwd[:, :, 0, 0] += x["emb_fwd"][:, :, 0]
        bwd[:, :, 0, 0] += x["emb_bwd"][:, :, 0]
        # each stage's backward as one stretch of host and GPU work (backward_overlap_s):
        # what the layers' passes save comes off its chunks' backward in proportion to their
        # waits, what of the logits' and loss's backward runs in the GPU's idle time off the
        # last chunk's
        full = {kind: {k: np.broadcast_to(v, (K, dp, pp)) for k, v in t.items()}
                for kind, t in types.items()}
        logits_b = np.zeros((K, dp, pp))
        logits_b[:, :, pp - 1] = x["logits_bwd"][:, :, pp - 1]
        saved_c, saved_rc, hidden = backward_overlap_s(full, self.stage_dense, self.stage_moe,
                                                       logits_b)
        saved = saved_c + saved_rc
        fwd[:, :, pp - 1, vp - 1] += x["logits_fwd"][:, :, pp - 1]
        bwd[:, :, pp - 1, vp - 1] += (logits_b - hidden)[:, :, pp - 1]
        chunk_waits = ((self.chunk_layers - self.chunk_moe)[None, None]
                       * full["dense"]["hb_wait"][..., None]
                       + self.chunk_moe[None, None] * full["moe"]["hb_wait"][..., None])
        stage_waits = chunk_waits.sum(axis=3, keepdims=True)
        bwd -= saved[..., None] * np.divide(chunk_waits, stage_waits,
                                            out=np.zeros_like(chunk_waits),
                                            where=stage_waits > 0)

        # pipeline sends s → s+1 (and pp-1 → 0 when interleaved), tp·cp pairs in parallel
        p2p_f = np.zeros((K, dp, pp))
        p2p_b = np.zeros((K, dp, pp))
        if pp > 1:
            src = gpus
            dst = np.roll(gpus, -1, axis=1)
            pf_bw, pf_lat = slowest(*links(src.reshape(-1), dst.reshape(-1)), cp * tp)
            pb_bw, pb_lat = slowest(*links(dst.reshape(-1), src.reshape(-1)), cp * tp)
            p2p_f = p2p_message_s(model, c, lc, pf_bw, pf_lat, tp_bw, tp_lat)
            p2p_b = p2p_message_s(model, c, lc, pb_bw, pb_lat, tp_bw, tp_lat)
            p2p_f = np.broadcast_to(p2p_f, (K, dp, pp)).copy()
            p2p_b = np.broadcast_to(p2p_b, (K, dp, pp)).copy()

        # data-parallel reduction per stage under the windows of its own layers (the
        # closed form's, of the pacing rank's), the longest of its replicas': [K, pp]
        windows = dp_windows_s(layers_terms_s(types, self.stage_dense, self.stage_moe), saved)
        bwd_window, fwd_window = (np.broadcast_to(w, (K, dp, pp)).max(axis=1)
                                  for w in windows)
        expert = (self.stage_expert_params, self.expert_comm["edp_bw"],
                  self.expert_comm["edp_lat"]) if model.is_moe else None
        tail = dp_exposed_s(c, self.stage_params, dp_bw, dp_lat, bwd_window_s=bwd_window,
                            fwd_window_s=fwd_window, expert=expert)
        tail = np.broadcast_to(tail, (K, pp)).astype(float).copy()
        if pp > 1:
            t_emb = np.broadcast_to(tied_embedding_s(model, c, pf_bw[:, :, pp - 1].min(axis=1),
                                                     pf_lat[:, :, pp - 1].max(axis=1)), (K,))
            tail[:, 0] += t_emb
            tail[:, pp - 1] += t_emb
        return dict(fwd=fwd, bwd=bwd, p2p_f=p2p_f, p2p_b=p2p_b, tail=tail, opt=self.opt_s)

    def _scheduled_terms(self, placements) -> dict:
        """:meth:`terms_many` of ``(node_hosts, gpu_order)`` placements with 1F1B's sends
        folded into their senders."""
        if self.uniform:
            gpus = np.broadcast_to(self.ranks, (len(placements), *self.ranks.shape))
        else:
            gpus = np.stack([self.rank_gpus(nh, go) for nh, go in placements])
        t = self.terms_many(gpus)
        pp = t["p2p_f"].shape[2]
        plain_1f1b = self.vp == 1
        if plain_1f1b and pp > 1:
            # 1F1B: Megatron batches each send with the next receive and waits for both
            # (overlap_p2p_comm is forced off without interleaving, megatron/training/
            # arguments.py): the sending rank is busy for the send
            t["fwd"][:, :, :pp - 1, 0] += t["p2p_f"][:, :, :pp - 1]
            t["bwd"][:, :, 1:, 0] += t["p2p_b"][:, :, :pp - 1]
            t["p2p_f"], t["p2p_b"] = np.zeros_like(t["p2p_f"]), np.zeros_like(t["p2p_b"])
        return t

    def _replica_rows(self, t: dict) -> np.ndarray:
        """One row per placement and data-parallel replica ``[K, dp, 2·pp·vp + 3·pp]``: its
        forward and backward chunk times, sends both ways and the stages' tails (what it
        simulates)."""
        K, dp, pp = t["p2p_f"].shape
        return np.concatenate([t["fwd"].reshape(K, dp, -1), t["bwd"].reshape(K, dp, -1),
                               t["p2p_f"], t["p2p_b"],
                               np.broadcast_to(t["tail"][:, None], (K, dp, pp))], axis=2)

    def _makespans(self, rows: np.ndarray) -> np.ndarray:
        """Simulated makespan (before the optimizer step) of every row of
        :meth:`_replica_rows` output (flattened to ``[rows, columns]``), each distinct row
        simulated once, all in one call."""
        pp, vp = self.pp, self.vp
        n = pp * vp
        uniq, inv = distinct_rows(rows)
        keys = [r.tobytes() for r in uniq]
        memo = self._simulated
        if (len(memo) + len(keys)) * uniq.itemsize * uniq.shape[1] > MEMO_BYTES:
            memo.clear()
        new = [i for i, k in enumerate(keys) if k not in memo]
        if new:
            u = uniq[new]
            sim = simulate(u[:, :n].reshape(-1, pp, vp), u[:, n:2 * n].reshape(-1, pp, vp),
                           u[:, 2 * n:2 * n + pp], u[:, 2 * n + pp:2 * n + 2 * pp],
                           self.num_microbatches, tail_s=u[:, 2 * n + 2 * pp:])
            memo.update(zip((keys[i] for i in new), sim.iteration_time_s.tolist()))
        return np.array([memo[k] for k in keys])[inv]

    def times(self, placements) -> np.ndarray:
        """Simulated iteration times ``[K]`` (seconds) of ``K`` placements, each a
        ``(node_hosts, gpu_order)`` pair as :meth:`time` takes; the same floats as
        :meth:`time`, but the placements are priced together (:meth:`terms_many`, at most
        :data:`BATCH_GPUS` ranks at once) and every distinct replica of every placement is
        simulated in one batched call (:func:`simulate` walks the schedule level by level
        over all of them), which is what makes pricing a placement neighbourhood or 100
        random placements cheap."""
        placements = list(placements)
        if not placements:
            return np.zeros(0)
        step = max(1, BATCH_GPUS // self.world_size)
        slices = []                 # per slice: its distinct replica rows, their inverse, K
        for start in range(0, len(placements), step):
            rows = self._replica_rows(self._scheduled_terms(placements[start:start + step]))
            k, dp = rows.shape[:2]
            slices.append((*distinct_rows(rows.reshape(k * dp, -1)), k))
        spans = self._makespans(np.concatenate([u for u, _, _ in slices]))
        worst, at = [], 0
        for uniq, inv, k in slices:
            worst.append(spans[at:at + len(uniq)][inv].reshape(k, -1).max(axis=1))
            at += len(uniq)
        return np.concatenate(worst) + self.opt_s

    def time(self, node_hosts, gpu_order, *, record: bool = False) -> PlacedTime:
        """Simulated iteration time under the placement ``node_hosts`` (``[N]`` host
        indices of node ranks 0..N-1) and ``gpu_order`` (``[N, G]`` GPU index of each
        local rank). Replicas with identical stage and link times are simulated once.
        ``record`` keeps the slowest replica's op times and critical path (``sim`` then
        holds that one replica)."""
        t = self._scheduled_terms([(node_hosts, gpu_order)])
        per_replica = self._makespans(self._replica_rows(t)[0])
        t = {k: v if k == "opt" else v[0] for k, v in t.items()}
        worst = int(np.argmax(per_replica))
        timed = PlacedTime(iteration_time_s=float(per_replica[worst]) + t["opt"],
                           stage_fwd_s=t["fwd"], stage_bwd_s=t["bwd"], p2p_fwd_s=t["p2p_f"],
                           p2p_bwd_s=t["p2p_b"], dp_tail_s=t["tail"], optimizer_s=t["opt"],
                           critical_replica=worst, sim=None,
                           num_microbatches=self.num_microbatches)
        return dataclasses.replace(timed, sim=timed.recorded()) if record else timed

    def default_placement(self) -> tuple[np.ndarray, np.ndarray]:
        """Megatron's sequential mapping on the first N hosts: node rank ``n`` on host
        ``n``, local rank ``k`` on GPU ``k``."""
        G = self.cluster.gpus_per_node
        return (np.arange(self.num_nodes, dtype=np.int64),
                np.tile(np.arange(G, dtype=np.int64), (self.num_nodes, 1)))

    def objective(self, node_hosts, gpu_order) -> float:
        """:meth:`time`'s iteration time (the placement search minimises it)."""
        return self.time(node_hosts, gpu_order).iteration_time_s
