"""Every plan Megatron-LM would accept for a model, world size and global batch size.

One flat enumerator used everywhere (search, published-choice analysis, tests). Values are
generated level by level (tp, then cp, then pp with dp derived, then a numpy grid of micro
batch size, vp, recompute, sequence parallelism and distributed optimizer) and filtered by
:data:`configurator.core.rules.RULES`, each applied at the first level where the fields it
reads are known: the very predicates ``estimate`` checks one plan with.

Beyond Megatron's rules the search leaves out one kind of duplicate: the distributed
optimizer where dp·cp = 1 (with one data-parallel rank it is the plain optimizer).
"""

from __future__ import annotations

import numpy as np

from configurator.core.model import ModelSpec
from configurator.core.plan import PLAN_FIELD, search_options
from configurator.core.plan_terms import param_gather_overlap
from configurator.core.layers import format_layout, split_ok, virtual_stage_layers
from configurator.core.rules import SPLIT_FIELDS, rules_for, rules_mask
from configurator.core.plan_batch import (COLUMN_FIELDS, GROUP_KEY_FIELDS, PlanBatch,
                                         column_dtype, column_value)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


#: The layout dimensions, enumerated one level at a time (dp is derived); every other
#: per-candidate plan field is varied in one numpy grid per layout, in schema order, the
#: layer-split fields (vp and how layers are spread over the pipeline, a pipeline layout
#: included) as one joint dimension of the splits Megatron builds (:func:`layer_splits`).
LAYOUT = ("tp", "cp", "pp", "dp")
JOINT = tuple(n for n in SPLIT_FIELDS if n != "pp")
GRID_FIELDS = tuple(f for f in COLUMN_FIELDS if f.name not in LAYOUT and f.name not in JOINT)
#: How much lighter than a middle rank an end rank of an uneven split may be (layers).
UNEVEN_LIGHTER_MAX = 4
#: Fewest decoder layers of a middle virtual stage of a pipeline layout the search tries
#: (Megatron-Bridge's deepest DeepSeek-V3 layout, ``Et|(tt|)*30mL``, holds 2).
LAYOUT_MIN_LAYERS = 2


def layout_splits(model: ModelSpec, pp: int, vp: int, min_middle: int = 1) -> list[str]:
    """Pipeline layouts (:func:`configurator.core.layers.format_layout`) of ``pp·vp`` virtual
    stages for a model whose layers no field-based split builds at that pp and vp
    (DeepSeek-V3's 61 on 16 stages): every middle stage ``c >= min_middle`` decoder layers,
    the first (with the embedding) and the last (with the MTP layers and the loss) ``c`` or
    up to :data:`UNEVEN_LIGHTER_MAX` fewer, as Megatron-Bridge's DeepSeek-V3 layouts are
    (``Et*4|(t*4|)*14tmL``); [] where none adds up."""
    L, n, mtp = model.num_layers, pp * vp, model.mtp_num_layers or 0
    if n < 3:
        return []
    out = []
    for c in range(max(min_middle, L // n), L // (n - 2) + 1):
        rest = L - (n - 2) * c        # first + last
        for a in range(max(0, c - UNEVEN_LIGHTER_MAX), c + 1):
            b = rest - a
            if max(0, c - UNEVEN_LIGHTER_MAX) <= b <= c:
                out.append(format_layout([a] + [c] * (n - 2) + [b], mtp))
    return out


def layer_splits(model: ModelSpec, pp: int) -> list[tuple[int, int, int, bool, bool, str]]:
    """Layer splits the search tries on ``pp`` ranks: ``(vp, first, last, account_embedding,
    account_loss, layout)`` tuples Megatron accepts (:func:`configurator.core.layers.split_ok`,
    :func:`configurator.core.layers.layout_problem`).

    Where ``pp`` divides the layers, the even split with every legal vp. Where it does not
    (Llama-3.1 405B's 126 layers on pp 8): embedding/loss-aware splits (one or both counted
    as a layer) with every legal vp, and uneven splits whose end ranks hold up to
    :data:`UNEVEN_LIGHTER_MAX` layers fewer than a middle rank (they carry the embedding or
    the output layer), at every vp that divides them; then, at each vp none of those reaches,
    the pipeline layouts of :func:`layout_splits` whose middle stages hold at least
    :data:`LAYOUT_MIN_LAYERS` layers (DeepSeek-V3's 61 layers at vp > 1).
    """
    L = model.num_layers
    out = []
    if L % pp == 0:
        out += [(vp, 0, 0, False, False, "") for vp in divisors(L // pp)
                if split_ok(L, pp=pp, vp=vp, first=0, last=0, account_embedding=False,
                            account_loss=False)]
        return out
    if pp == 1:
        return out
    for ae, al in ((True, True), (True, False), (False, True)):
        total = L + ae + al
        if total % pp == 0:
            out += [(vp, 0, 0, ae, al, "") for vp in divisors(total // pp)
                    if split_ok(L, pp=pp, vp=vp, first=0, last=0, account_embedding=ae,
                                account_loss=al)]
    # an uneven split that builds exactly what an accounted one builds is the same plan
    seen = set(out)
    layouts = {(x[0], virtual_stage_layers(L, pp, *x)) for x in out}
    # an end rank holds at most a middle rank's layers and at least UNEVEN_LIGHTER_MAX
    # fewer, so with pp·mid - 2·UNEVEN_LIGHTER_MAX <= L <= pp·mid both ends lie in
    # [L/pp - UNEVEN_LIGHTER_MAX, (L + 2·UNEVEN_LIGHTER_MAX)/pp]
    lo = max(1, L // pp - UNEVEN_LIGHTER_MAX)
    hi = min(L - 1, (L + 2 * UNEVEN_LIGHTER_MAX) // pp + 1)
    for first in range(lo, hi + 1):
        for last in range(lo, min(hi, L - first) + 1):
            mid_ranks = pp - 2
            if mid_ranks == 0:
                per_mid = max(first, last)
            elif (L - first - last) % mid_ranks:
                continue
            else:
                per_mid = (L - first - last) // mid_ranks
            if not (0 <= per_mid - first <= UNEVEN_LIGHTER_MAX
                    and 0 <= per_mid - last <= UNEVEN_LIGHTER_MAX):
                continue
            for vp in divisors(max(first, 1)):
                key = (vp, first, last, False, False, "")
                if key not in seen and split_ok(L, pp=pp, vp=vp, first=first, last=last,
                                                account_embedding=False, account_loss=False):
                    seen.add(key)
                    layout = (vp, virtual_stage_layers(L, pp, *key))
                    if layout not in layouts:
                        layouts.add(layout)
                        out.append(key)
    reached = {x[0] for x in out}
    # (pp·vp - 2) middle stages of LAYOUT_MIN_LAYERS layers at least
    for vp in range(1, (L // LAYOUT_MIN_LAYERS + 2) // pp + 1):
        if vp not in reached and (vp == 1 or pp > 1):
            out += [(vp, 0, 0, False, False, x)
                    for x in layout_splits(model, pp, vp, LAYOUT_MIN_LAYERS)]
    return out


class SearchSpace:
    """Restrictions on the search: ``SearchSpace(recompute=("full",), cp=(1,))`` keeps only
    those values of those fields (by name or alias, e.g. ``mbs``); a field not named takes
    every value Megatron accepts. Raises ValueError for a name that is not a per-candidate
    plan field."""

    def __init__(self, **allowed: tuple):
        names = {f.name: f.name for f in COLUMN_FIELDS} | {
            f.alias: f.name for f in COLUMN_FIELDS if f.alias}
        unknown = set(allowed) - set(names)
        if unknown:
            raise ValueError(f"SearchSpace: not plan fields searched over: {sorted(unknown)}")
        self.allowed = {names[k]: tuple(v) for k, v in allowed.items() if v is not None}

    def allow(self, name: str, values) -> list:
        """``values`` (in order) that the restriction on field ``name`` keeps."""
        chosen = self.allowed.get(name)
        return [x for x in values if chosen is None or x in chosen]

    def __repr__(self) -> str:
        return f"SearchSpace({self.allowed})"


def product_columns(values: list[np.ndarray]) -> list[np.ndarray]:
    """The Cartesian product of the 1-D arrays ``values`` as one column per array, rows in C
    order (the last array varies fastest): what ``np.meshgrid(*values, indexing="ij")``
    gives raveled, each column of length ``prod(len(v))`` and its array's dtype."""
    total = 1
    for v in values:
        total *= len(v)
    out, outer, inner = [], 1, total
    for v in values:
        inner //= max(len(v), 1)
        col = v.repeat(inner)
        if outer > 1:   # the block repeated ``outer`` times
            block = np.empty((outer, col.size), col.dtype)
            block[:] = col
            col = block.reshape(-1)
        out.append(col)
        outer *= len(v)
    return out


def _grid_values(f, model: ModelSpec, global_batch_size: int, pp: int) -> np.ndarray:
    """Every value of grid field ``f`` before the rules filter (choices as codes)."""
    if f.choices:
        return np.array([f.choices.index(c) for c in f.choices], dtype=np.int64)
    if f.type is bool:
        return np.array([False, True])
    # the integers a rule could accept: divisors of what they must divide
    if f.name == "micro_batch_size":
        return np.array(divisors(global_batch_size), dtype=np.int64)
    if f.name == "ep":
        return np.array(divisors(model.num_experts) if model.is_moe else [1], dtype=np.int64)
    if f.name == "etp":
        return np.array(divisors(model.moe_ffn_hidden_size) if model.is_moe else [1],
                        dtype=np.int64)
    raise ValueError(f"no grid values for plan field {f.name}")


def _restricted(f, values: np.ndarray, space: SearchSpace) -> np.ndarray:
    if f.choices:
        keep = space.allow(f.name, f.choices)
        return np.array([f.choices.index(c) for c in keep], dtype=np.int64)
    return np.array(space.allow(f.name, values.tolist()), dtype=values.dtype)


def enumerate_plans(model: ModelSpec, world_size: int, global_batch_size: int, *,
                    overlap_grad_reduce: bool = True, overlap_param_gather: bool = True,
                    space: SearchSpace = SearchSpace(), **options) -> PlanBatch:
    """All legal plans as a :class:`PlanBatch` column store (may be empty). ``options``:
    the :data:`~configurator.core.plan.SEARCH_OPTIONS` every plan carries (default: the plan
    defaults)."""
    shared = dict(global_batch_size=global_batch_size, overlap_grad_reduce=overlap_grad_reduce,
                  overlap_param_gather=overlap_param_gather, **search_options(**options))
    # Fields known at each level; overlap_param_gather is decided per plan (only with the
    # distributed optimizer), so rules reading it wait for the grid.
    base = set(shared) - {"overlap_param_gather"}
    levels = [base | {"tp"}, base | {"tp", "cp"}, base | set(LAYOUT),
              set(shared) | set(LAYOUT) | {f.name for f in GRID_FIELDS} | set(JOINT)]
    stage = [rules_for(levels[i], levels[i - 1] if i else ()) for i in range(4)]
    # Grid rules that read one grid field filter that field's values before the grid is
    # built (smaller grids); the others run on the grid.
    grid_names = {f.name for f in GRID_FIELDS} | set(JOINT)
    single = {f.name: tuple(r for r in stage[3] if r.needs & grid_names == {f.name})
              for f in GRID_FIELDS}
    # the joint split dimension holds only splits layer_splits found legal: the rules that
    # read nothing but the split fields are met by construction
    multi = tuple(r for r in stage[3] if len(r.needs & grid_names) != 1
                  and not r.needs <= set(SPLIT_FIELDS))

    def with_derived(fields: dict) -> dict:
        # overlap_param_gather is decided per plan, as PlanBatch.plan decides it
        if "distributed_optimizer" in fields:
            fields["overlap_param_gather"] = param_gather_overlap(
                overlap_param_gather, fields["distributed_optimizer"])
        return fields

    # (field, pp, values of the layout fields its rules read) -> its legal values
    legal_values: dict[tuple, np.ndarray] = {}
    splits: dict[int, dict] = {}   # pp -> its layer splits: a column per JOINT field, "count"
    reads = {name: sorted({n for r in rules for n in r.needs} & set(LAYOUT))
             for name, rules in single.items()}
    multi_reads = sorted({n for r in multi for n in r.needs} & set(LAYOUT))
    # (pp, the grid fields' values, the values of the layout fields the grid rules read) ->
    # the grid's plans those rules keep (many layouts share them)
    kept_grids: dict[tuple, dict] = {}
    allow = space.allow
    world = world_size
    cols: dict[str, list[np.ndarray]] = {f.name: [] for f in COLUMN_FIELDS
                                         if f.name not in LAYOUT}
    counts: list[int] = []   # plans kept per layout
    keys = []

    def legal(values: list[int], fields: dict, rules) -> list[int]:
        """The ``values`` of one level (arrays in ``fields``) that pass ``rules``."""
        keep = rules_mask(model, fields, world, rules)
        if np.ndim(keep) == 0:
            return values if keep else []
        return [x for x, k in zip(values, keep) if k]

    tps = allow("tp", divisors(world))
    for tp in legal(tps, dict(shared, tp=np.array(tps)), stage[0]):
        f1 = dict(shared, tp=tp)
        cps = allow("cp", divisors(world // tp))
        for cp in legal(cps, dict(f1, cp=np.array(cps)), stage[1]):
            f2 = dict(f1, cp=cp)
            # dp follows from the layout: a restriction on it keeps the pp values giving it
            pps = np.array([p for p in allow("pp", divisors(world // (tp * cp)))
                            if allow("dp", [world // (tp * cp * p)])], dtype=np.int64)
            for pp in legal(pps.tolist(), dict(f2, pp=pps, dp=world // (tp * cp * pps)),
                            stage[2]):
                dp = world // (tp * cp * pp)
                f3 = dict(f2, pp=pp, dp=dp)
                values = []
                for f in GRID_FIELDS:
                    # a field's legal values depend only on the layout fields its rules read
                    key = (f.name, pp, tuple(f3[n] for n in reads[f.name]))
                    if key not in legal_values:
                        vals = _restricted(f, _grid_values(f, model, global_batch_size, pp),
                                           space)
                        if single[f.name] and len(vals):
                            keep = rules_mask(model, with_derived(dict(f3, **{f.name: vals})),
                                              world, single[f.name])
                            vals = vals[keep] if np.ndim(keep) else vals[:len(vals) * keep]
                        legal_values[key] = vals
                    vals = legal_values[key]
                    if f.name == "distributed_optimizer" and dp * cp == 1:
                        vals = vals[~vals]   # over one data-parallel rank: the plain optimizer
                    if f.name == "etp":
                        vals = vals[(vals == 1) | (vals == tp)]  # experts split as the rest, or not
                    values.append(vals)
                if pp not in splits:
                    kept = [x for x in layer_splits(model, pp)
                            if all(allow(n, [val]) for n, val in zip(JOINT, x))]
                    splits[pp] = {n: np.array([column_value(PLAN_FIELD[n], x[j]) for x in kept],
                                              dtype=column_dtype(PLAN_FIELD[n]))
                                  for j, n in enumerate(JOINT)}
                    splits[pp]["count"] = len(kept)
                values.append(np.arange(splits[pp]["count"]))
                if not all(len(x) for x in values):
                    continue
                kept_key = (pp, *(v.tobytes() for v in values),
                            *(f3[name] for name in multi_reads))
                kept_plans = kept_grids.get(kept_key)
                if kept_plans is None:
                    columns = product_columns(values)
                    grid = dict(zip((f.name for f in GRID_FIELDS), columns))
                    for name in JOINT:   # the last dimension: the split's index
                        grid[name] = splits[pp][name].take(columns[-1])
                    ok = rules_mask(model, with_derived(dict(f3, **grid)), world, multi)
                    # the plans kept, as indices: one scan of the mask, not one per column
                    ok = (slice(None) if ok else slice(0)) if np.ndim(ok) == 0 else \
                        np.flatnonzero(ok)
                    kept_plans = kept_grids[kept_key] = {name: arr[ok]
                                                         for name, arr in grid.items()}
                n = len(kept_plans[GRID_FIELDS[0].name])
                if not n:
                    continue
                keys.append(tuple(f3[name] for name in GROUP_KEY_FIELDS))
                counts.append(n)
                for name, arr in kept_plans.items():
                    cols[name].append(arr)
    cat = lambda parts, dt: (np.concatenate(parts).astype(dt, copy=False)  # noqa: E731
                             if parts else np.zeros(0, dt))
    group_keys = np.array(keys, dtype=np.int64).reshape(-1, len(GROUP_KEY_FIELDS))
    group = np.repeat(np.arange(len(keys), dtype=np.int64), counts)
    # the layout columns from each plan's layout
    columns = {f.name: (group_keys[:, GROUP_KEY_FIELDS.index(f.name)].take(group)
                        .astype(column_dtype(f), copy=False)) if f.name in LAYOUT
               else cat(cols[f.name], column_dtype(f)) for f in COLUMN_FIELDS}
    return PlanBatch(columns, shared, group=group, group_keys=group_keys)
