"""Findings of the hostile-input pass (docs/hostile-input.md), each a case that passed silently or
raised the wrong exception before its fix: masked arrays, non-callable callbacks, arena rows
outside the arena, empty policy lists, empty config strings, odd layer-group containers, a budget
larger than the largest arena, a host store whose size overflows."""

import numpy as np
import pytest

import tierkit
from tierkit import experts, kv

if tierkit.has_lab:
    from tierkit import sim

G = experts.Geometry(2, 8, 2)
MAP = experts.ResidencyMap.first_k("m", G)


def kv_geometry(**kw):
    return kv.Geometry(row_bytes=16, layers=2, page_rows=4, arena_pages=16, hot_rows=8,
                       tail_rows=4, **kw)


def masked(a):
    return np.ma.array(a, mask=np.zeros(np.shape(a), bool))


def test_masked_arrays_are_type_errors_naming_the_argument():
    pool = kv.ElasticPool(kv_geometry(), elastic=False)
    token = np.zeros(32, np.uint8)
    pool.admit(1, np.tile(token, 20))
    topk = np.array([[3]], np.int32)
    calls = [
        ("history", lambda: pool.admit(2, masked(np.tile(token, 20)))),
        ("tokens", lambda: pool.append(1, masked(token))),
        ("topk", lambda: pool.resolve([1], [0, 1], [20], masked(topk))),
        ("sessions", lambda: pool.resolve(masked(np.array([1])), [0, 1], [20], topk)),
        ("indices", lambda: pool.resolve([1], [0, 1], [20], topk,
                                         indices=masked(np.zeros((1, 1), np.int32)))),
        ("candidates", lambda: pool.prefetch(1, masked(np.array([3])), 0)),
        ("ids", lambda: experts.PickCounters(G).record_layer(0, masked(np.zeros((1, 2), np.int32)))),
        ("counts", lambda: experts.PickCounters(G).add_counts(masked(np.ones((2, 8), np.int64)))),
        ("counts", lambda: experts.fit_seed_map("m", G, masked(np.ones((2, 8))))),
        ("counts", lambda: experts.seed_coverage(MAP, masked(np.ones((2, 8))))),
    ]
    for name, call in calls:
        with pytest.raises(TypeError, match=f"{name} is a masked array"):
            call()
    assert pool.committed_len(1) == 20 and pool.active_sessions == 1  # nothing changed
    # A filled copy is what the caller means.
    pool.append(1, masked(token).filled(0))
    assert pool.committed_len(1) == 21


def test_teardown_callbacks_must_be_callable():
    pool = kv.ElasticPool(kv_geometry(), max_sessions=2, max_history=16)
    for bad in (5, None, "deregister"):
        with pytest.raises(TypeError, match="callback must be callable"):
            pool.on_teardown(bad)
    seen = []
    pool.on_teardown(lambda addr, n: seen.append(n))
    pool.close()
    assert seen == [2 * 16 * 32]


def test_arena_rows_outside_the_arena_are_value_errors():
    pool = kv.ElasticPool(kv_geometry(), elastic=False)
    rows = pool.geometry.arena_rows
    assert len(pool.arena_row(1, rows - 1)) == 16
    for layer, row in ((2, 0), (0, rows), (0, -1), (0, -7), (2**32 - 1, 0)):
        with pytest.raises(ValueError, match=f"no arena row {row} in layer {layer}"):
            pool.arena_row(layer, row)


def test_group_of_checks_its_int():
    g = kv_geometry(layer_groups="one")
    assert g.group_of(1) == 0
    with pytest.raises(ValueError, match="layer = 2 is out of range"):
        g.group_of(2)
    with pytest.raises(ValueError, match="layer = .* is out of range"):
        g.group_of(2**70)  # was OverflowError
    with pytest.raises(TypeError, match="layer must be an int, not bool"):
        g.group_of(True)


def test_layer_groups_that_are_no_list_of_sizes_are_type_errors():
    for bad in (True, b"\x01\x01", {1: 1}, {2}, frozenset([2])):
        with pytest.raises(TypeError, match="layer_groups must be"):
            kv_geometry(layer_groups=bad)
    with pytest.raises(TypeError, match=r"layer_groups\[1\] must be an int"):
        kv_geometry(layer_groups=[1, 1.0])
    assert kv_geometry(layer_groups=(1, 1)).layer_groups == [1, 1]
    assert kv_geometry(layer_groups=range(2, 3)).layer_groups == [2]


@pytest.mark.lab
def test_scoreboard_policies_must_name_at_least_one_policy_once():
    short = dict(steps=60, shift_at=20, tokens_per_step=4)
    with pytest.raises(ValueError, match="policies is empty"):
        sim.scoreboard(policies=[], **short)  # was an empty table
    with pytest.raises(TypeError, match="policies must be a list"):
        sim.scoreboard(policies="static", **short)
    with pytest.raises(TypeError, match=r"policies\[0\] must be a policy name"):
        sim.scoreboard(policies=[1], **short)
    with pytest.raises(ValueError, match=r"policies\[1\]: \"static\" is given twice"):
        sim.scoreboard(policies=["static", "static"], **short)
    with pytest.raises(ValueError, match=r"policies\[0\]: unknown policy"):
        sim.scoreboard(policies=["nope"], **short)
    rows = sim.scoreboard(policies=("static",), **short)["rows"]
    assert [r["label"] for r in rows] == ["static"]


def test_an_empty_config_string_is_no_config():
    for blank in ("", "  ", "\n"):
        with pytest.raises(ValueError, match="config JSON is empty"):
            experts.Controller(MAP, blank)  # was the defaults, silently
    assert experts.Controller(MAP, None).config == experts.Controller(MAP, {}).config


@pytest.mark.lab
def test_an_empty_scoreboard_config_string_is_no_config():
    for blank in ("", "  ", "\n"):
        with pytest.raises(ValueError, match="config JSON is empty"):
            sim.scoreboard(steps=60, shift_at=20, config=blank)


def test_a_budget_beyond_the_largest_arena_warns():
    with pytest.warns(UserWarning, match=r"budget_bytes = 9223372036854775808: the arena is capped"):
        g = kv.Geometry.for_hbm_budget(2**63, 16, 2, 4, 8, 4)
    assert g.arena_rows * g.layers * g.row_bytes <= 2**40
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kv.Geometry.for_hbm_budget(16 * 128 + 100, 16, 2, 4, 8, 4).arena_pages == 16


def test_a_host_store_whose_size_overflows_is_a_value_error():
    # Was a panic (InternalError) in StoreLayout::store_bytes.
    with pytest.raises(ValueError, match="overflows 64 bits"):
        kv.ElasticPool(kv_geometry(), max_sessions=2**32 - 1, max_history=2**32 - 1)


@pytest.mark.lab
def test_synth_ids_refuses_the_other_scenarios_arguments():
    # Each was ignored silently: zipf without a shape, the OLMoE shift with one.
    with pytest.raises(ValueError, match="zipf applies to shape="):
        sim.synth_ids(steps=2, tokens_per_step=1, zipf=float("nan"))
    for kw in (dict(shift_at=1), dict(from_domain="book"), dict(to_domain="arxiv")):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=f"{name} applies to the OLMoE scenario"):
            sim.synth_ids(steps=2, tokens_per_step=1, shape=(2, 8, 2), **kw)
    assert sim.synth_ids(steps=2, tokens_per_step=1, shape=(2, 8, 2), zipf=0.0)["top_k"] == 2
    assert sim.synth_ids(steps=2, tokens_per_step=1, shift_at=1, to_domain="arxiv")["top_k"] == 8


BAD_CONFIGS = ((b"{}", TypeError), ({1, 2}, TypeError),
               ({"half_life_steps": float("nan")}, ValueError))


@pytest.mark.lab
def test_scoreboard_config_objects_json_refuses_name_the_argument():
    for bad, exc in BAD_CONFIGS:
        with pytest.raises(exc, match="config must be"):
            sim.scoreboard(steps=60, shift_at=20, config=bad)


def test_config_objects_json_refuses_name_the_argument():
    for bad, exc in BAD_CONFIGS:
        with pytest.raises(exc, match="config must be a JSON string or a JSON-serialisable dict"):
            experts.Controller(MAP, bad)
    with pytest.raises(TypeError, match="message must be"):
        experts.Controller(MAP).apply_control(b"{}")
    circular = {}
    circular["x"] = circular
    with pytest.raises(ValueError, match="config must be"):
        experts.Controller(MAP, circular)


def test_baseline_without_counters_says_what_to_pass():
    # It used to say "length mismatch: expected N, found 0".
    with pytest.raises(ValueError, match=r"pass them with the message \(Python `apply_control\(message, counters\)`"):
        experts.Controller(MAP).apply_control({"baseline": True})


@pytest.mark.lab
def test_scoreboard_shift_at_zero_says_what_to_give():
    # It used to say "phase start steps must increase", naming neither shift_at nor the fix.
    with pytest.raises(ValueError, match=r"shift at step 0: .*from_domain.*shift_at"):
        sim.scoreboard(steps=60, shift_at=0)


def test_wrong_types_of_objects_bools_and_strs_name_the_argument_in_the_message():
    # PyO3 named the argument only in a note ("while processing 'elastic'"), which str(e) never
    # shows and Python < 3.11 drops: "'int' object is not an instance of 'bool'".
    pool = kv.ElasticPool(kv_geometry())
    topk = np.zeros((1, 1), np.int32)
    counters = experts.PickCounters(G)
    cases = [
        ("geometry", lambda: kv.ElasticPool(None)),
        ("elastic", lambda: kv.ElasticPool(kv_geometry(), elastic=2)),
        ("lock", lambda: kv.ElasticPool(kv_geometry(), max_sessions=1, max_history=4, lock="y")),
        ("packed", lambda: pool.resolve([1], [0, 1], [1], topk, packed=2)),
        ("geometry", lambda: experts.PickCounters(kv_geometry())),
        ("model", lambda: experts.ResidencyMap.first_k(5, G)),
        ("geometry", lambda: experts.ResidencyMap.first_k("m", None)),
        ("geometry", lambda: experts.ResidencyMap.from_hot_sets("m", 3, [[0, 1], [0, 1]])),
        ("json", lambda: experts.ResidencyMap.from_json(b"{}", G)),
        ("map", lambda: experts.Controller(G)),
        ("map", lambda: experts.MemoryExecutor(None, 16)),
        ("counters", lambda: experts.Controller(MAP).step(G, experts.NullExecutor())),
        ("counters", lambda: experts.Controller(MAP).apply_control({}, counters=MAP)),
        ("geometry", lambda: experts.fit_seed_map("m", MAP, np.ones((2, 8)))),
        ("map", lambda: experts.seed_coverage(G, np.ones((2, 8)))),
    ]
    for name, call in cases:
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value).startswith(f"{name}: "), (name, str(e.value))
    # None still means the default; a numpy bool is a bool.
    kv.ElasticPool(kv_geometry(), elastic=None, lock=None)
    kv.ElasticPool(kv_geometry(), elastic=np.bool_(False))
    experts.Controller(MAP).apply_control({}, counters=None)
    experts.Controller(MAP).apply_control({"baseline": True}, counters)


@pytest.mark.lab
def test_float_arguments_refuse_bools_and_name_the_argument():
    # reuse=True ran as reuse 1.0 (Python makes a bool a float); a str named nothing.
    with pytest.raises(TypeError, match="reuse must be a float, not bool"):
        sim.synth_ids(steps=4, tokens_per_step=2, reuse=True)
    with pytest.raises(TypeError, match="zipf must be a float, not bool"):
        sim.synth_ids(steps=4, tokens_per_step=2, shape=(1, 8, 2), zipf=False)
    with pytest.raises(TypeError, match=r"^reuse: "):
        sim.synth_ids(steps=4, tokens_per_step=2, reuse="0.5")
    assert sim.synth_ids(steps=4, tokens_per_step=2, shape=(1, 8, 2), zipf=0.5, reuse=np.float32(0.25))


@pytest.mark.lab
def test_lab_str_arguments_name_the_argument_in_the_message():
    # PyO3 named them only in a note: "'int' object is not an instance of 'str'".
    for name, call in [
        ("from_domain", lambda: sim.scoreboard(steps=40, shift_at=10, from_domain=5)),
        ("to_domain", lambda: sim.synth_ids(steps=4, tokens_per_step=2, to_domain=b"book")),
        ("format", lambda: sim.trace_ids("x.jsonl", format=1)),
        ("link", lambda: sim.link_stall_us(1, 1, 1, link=None or 3)),
    ]:
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value).startswith(f"{name}: "), (name, str(e.value))
    # The defaults still apply.
    assert sim.link_stall_us(1, 1, 1)["link"]["name"] == "h200-pcie"


def test_padded_row_format_budget_past_the_arena_cap_caps_with_a_warning():
    # Third pass (paged split rows): the binding sized contiguous pages, set the format, then
    # validated, so a padded arena past 1 TiB raised ValueError where a contiguous one capped with
    # a UserWarning, and a huge padded page at a small budget said "invalid geometry" for a
    # budget that was too small.
    for budget in (1 << 40, (1 << 40) + 1, 1 << 41, 2**64 - 1):
        capped = budget // (2 * 37440) > (1 << 40) // (2 * 37440)
        with pytest.warns(UserWarning, match="capped") if capped else _no_warning():
            g = kv.Geometry.for_hbm_budget(budget, 584, 2, 64, 128, 64, row_format="deepseek_v4")
        assert g.arena_pages == (1 << 40) // (2 * 37440)
        assert g.arena_pages * g.page_bytes * g.layers <= 1 << 40
    with pytest.warns(UserWarning, match="capped"):
        g = kv.Geometry.for_hbm_budget(1 << 41, 584, 61, 64, 128, 64, row_format="deepseek_v4")
    assert g.arena_pages == (1 << 40) // (61 * 37440)
    huge = {"value": 24, "scale": 8, "page_bytes": 2**32 - 1}
    with pytest.raises(ValueError, match="below one session"):
        kv.Geometry.for_hbm_budget(1 << 20, 32, 2, 16, 32, 16, row_format=huge)
    with pytest.warns(UserWarning, match="capped"):
        g = kv.Geometry.for_hbm_budget(1 << 45, 32, 2, 16, 32, 16, row_format=huge)
    assert g.arena_pages == (1 << 40) // (2 * (2**32 - 1))
    # Below the cap: the budget holds padded pages, never an arena over it.
    g = kv.Geometry.for_hbm_budget(3 * 2 * 37440 - 1 + 37440, 584, 2, 64, 128, 64,
                                   row_format="deepseek_v4", layer_groups="one")
    assert (g.arena_pages, g.layer_groups) == (3, [2])


class _no_warning:
    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def test_geometry_equality_compares_layer_groups_by_size_and_repr_round_trips():
    # Third pass: Geometry(..., layer_groups=[1, 1]) and the default per-layer groups of the same
    # 2 layers compared unequal, so eval(repr(g)) != g for every geometry (repr gives sizes).
    fmt = {"value": 24, "scale": 8, "page_bytes": 528}
    for kw in ({}, {"row_format": fmt}, {"layer_groups": "one"}, {"layer_groups": 1}):
        g = kv.Geometry(32, 2, 16, 24, 32, 16, **kw)
        assert eval(repr(g), {"Geometry": kv.Geometry}) == g, repr(g)
    assert kv.Geometry(32, 2, 16, 24, 32, 16, layer_groups=[2]) == kv.Geometry(
        32, 2, 16, 24, 32, 16, layer_groups="one")
    assert kv.Geometry(32, 2, 16, 24, 32, 16, layer_groups=[2]) != kv.Geometry(32, 2, 16, 24, 32, 16)
    assert kv.Geometry(32, 2, 16, 24, 32, 16, row_format=fmt) != kv.Geometry(32, 2, 16, 24, 32, 16)


def test_row_format_key_that_cannot_print_is_named_without_an_unraisable_error():
    class Odd:
        def __str__(self):
            raise RuntimeError("no str")

        def __repr__(self):
            raise RuntimeError("no repr")

    seen = []
    import sys
    old, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        with pytest.raises(ValueError, match="unknown key <a Odd key>"):
            kv.Geometry(32, 2, 16, 24, 32, 16,
                        row_format={Odd(): 1, "value": 24, "scale": 8, "page_bytes": 528})
        with pytest.raises(ValueError, match="unknown key 'extra'"):
            kv.Geometry(32, 2, 16, 24, 32, 16,
                        row_format={"extra": 1, "value": 24, "scale": 8, "page_bytes": 528})
    finally:
        sys.unraisablehook = old
    assert seen == []
