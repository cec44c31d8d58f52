"""Policies called directly: no event loop, no server."""

import random

import pytest

from scheduler_sidecar.core.records import PolicyError, Query
from scheduler_sidecar.systems import make_policy, policies
from scheduler_sidecar.systems.superserve.baselines import ClipperPlus, Infaas
from scheduler_sidecar.systems.superserve.greedy import MaxAcc, MaxBatch
from scheduler_sidecar.systems.superserve.slackfit import SlackFit
from tests.builders import POLICY_OPTIONS, decide, make_profile, make_queries, make_queue, make_workers

PROFILE = make_profile(n_variants=6, batch_sizes=tuple(range(1, 17)))


def test_buckets_are_monotone_and_take_the_largest_batch_in_their_band():
    """Bucket latencies rise; each bucket holds the largest batch among pairs in its band."""
    policy = SlackFit(PROFILE, num_buckets=12)
    lat = [b.latency_us for b in policy.buckets]
    assert lat == sorted(lat) and len(lat) > 3
    lo = policy.latency_us(PROFILE.variants[0], 1)
    hi = policy.latency_us(PROFILE.variants[-1], 16)
    width = (hi - lo) / 12
    for bucket in policy.buckets:
        band = min(int((bucket.latency_us - lo) / width), 11) if bucket.latency_us > lo else 0
        in_band = [(b, v.accuracy) for v in PROFILE.variants for b in range(1, 17)
                   if (min(int((policy.latency_us(v, b) - lo) / width), 11) if policy.latency_us(v, b) > lo else 0)
                   == band and policy.latency_us(v, b) <= hi]
        assert (bucket.batch_size, bucket.accuracy) == max(in_band)


def test_online_choice_never_exceeds_the_slack():
    """For any slack the chosen bucket's latency fits it (or no bucket is chosen)."""
    policy = SlackFit(PROFILE)
    for slack in range(0, 200_000, 777):
        bucket = policy.menu().bucket(slack)
        assert bucket is None or bucket.latency_us <= slack
        if bucket is not None:  # and it is the closest one below
            assert all(b.latency_us <= bucket.latency_us or b.latency_us > slack for b in policy.buckets)


def test_light_load_serves_the_most_accurate_subnet():
    """With one query and ample slack, SlackFit serves the most accurate subnet."""
    d = SlackFit(PROFILE).decide(0, make_queue(make_queries(n=1, slo_us=1_000_000)).view(), make_workers(1))
    assert d.dispatches[0].variant_id == PROFILE.variants[-1].id


def test_under_a_burst_batches_grow_and_accuracy_falls():
    """A long queue with shrinking slack moves SlackFit to larger batches of less accurate subnets."""
    policy = SlackFit(PROFILE)
    light = policy.decide(0, make_queue(make_queries(n=2, slo_us=60_000)).view(), make_workers(1)).dispatches[0]
    burst = make_queries(n=64, slo_us=60_000)
    choices = [policy.decide(waited_us, make_queue(burst).view(), make_workers(1)).dispatches[0]
               for waited_us in (20_000, 40_000, 50_000)]
    accuracies = [PROFILE.variant(d.variant_id).accuracy for d in [light, *choices]]
    assert all(len(d.query_ids) > len(light.query_ids) for d in choices)
    assert accuracies == sorted(accuracies, reverse=True) and accuracies[-1] < accuracies[0]


def test_expired_queries_are_dropped_by_default_and_served_on_request():
    """late_queries=drop drops heads no option can serve in time; serve runs them with the fastest option."""
    queries = make_queries(n=3, slo_us=500)  # slack 500 us is below every profiled latency
    for name in policies():
        d = decide(make_policy(name, PROFILE, **POLICY_OPTIONS.get(name, {})), queries, make_workers(1))
        assert d.dropped == (0, 1, 2) and not d.dispatches, name
        d = decide(make_policy(name, PROFILE, late_queries="serve", **POLICY_OPTIONS.get(name, {})), queries,
                   make_workers(1))
        assert not d.dropped and d.dispatches, name


def test_no_free_worker_means_no_decision():
    for name in policies():
        policy = make_policy(name, PROFILE, **POLICY_OPTIONS.get(name, {}))
        assert decide(policy, make_queries(4), make_workers(2, busy=2)).is_empty


@pytest.mark.parametrize("cls", [MaxAcc, MaxBatch])
def test_greedy_choices_fit_and_follow_their_priority(cls):
    """MaxAcc maximises accuracy then batch; MaxBatch batch then accuracy; both within the slack."""
    table = cls(PROFILE).menu()
    for slack in range(1_500, 120_000, 1_313):
        s, b = cls.pick(table, slack)
        assert table.rows[s][b] <= slack
        feasible = [(si, bi) for si in range(6) for bi in range(16) if table.rows[si][bi] <= slack]
        if cls is MaxAcc:
            assert (s, b) == max(feasible)
        else:
            assert b == max(bi for _, bi in feasible if _ == 0) and s == max(si for si, bi in feasible if bi == b)


def test_fixed_baselines_serve_one_variant():
    assert ClipperPlus(PROFILE, variant_id="v2").variant.id == "v2"
    assert Infaas(PROFILE).variant.id == PROFILE.variants[0].id
    d = ClipperPlus(PROFILE).decide(0, make_queue(make_queries(n=20, slo_us=30_000)).view(), make_workers(1))
    dispatch = d.dispatches[0]
    assert dispatch.variant_id == PROFILE.variants[-1].id
    assert ClipperPlus(PROFILE).latency_us(PROFILE.variants[-1], len(dispatch.query_ids)) <= 30_000


def test_unknown_policy_and_device_are_reported():
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope", PROFILE)
    with pytest.raises(ValueError, match="no latency for device 'gpu'"):
        make_policy("slackfit", PROFILE, device="gpu")


def test_edf_queue_orders_by_deadline_then_arrival():
    """The queue returns earliest deadlines first; equal deadlines keep arrival order."""
    rng = random.Random(4)
    queries = [Query(rng.choice([10, 20, 30]), i, i, 0) for i in range(50)]
    queue = make_queue(queries)
    queue.head(5)  # pull a front, then push before it
    queue.push(Query(5, 50, 50, 0))
    queue.discard(7)
    order = [q.id for q in queue.scan()]
    expected = [q.id for q in sorted(queries + [Query(5, 50, 50, 0)]) if q.id != 7]
    assert order == expected
    assert [q.id for q in queue.remove(order[:3])] == order[:3]
    assert len(queue) == 47
    with pytest.raises(PolicyError):
        queue.remove([999])
    assert [q.id for q in queue.scan()] == order[3:]  # a refused remove leaves the queue as it was
    middle = order[10:12]  # not at the head: the queries around them keep their order
    assert [q.id for q in queue.remove(middle)] == middle
    assert [q.id for q in queue.scan()] == order[3:10] + order[12:] and len(queue) == 45


@pytest.mark.parametrize("rule", ["serve", "yield"])
def test_slackfit_serves_below_bucket_zero_what_the_quickest_option_can_still_serve(rule):
    """A slack between the quickest option (fastest variant, batch 1) and bucket 0 is served, not dropped, when
    nothing is queued behind the batch that serves it (either rule)."""
    policy = SlackFit(PROFILE, below_buckets=rule)
    menu = policy.menu()
    quickest_us = min(policy.latency_us(v, 1) for v in PROFILE.variants)
    assert menu.fastest_us == quickest_us < menu.buckets[0].latency_us
    slack = (quickest_us + menu.buckets[0].latency_us) // 2
    _, batch = menu.choose(slack)
    d = policy.decide(0, make_queue(make_queries(n=batch, slo_us=slack)).view(), make_workers(1))
    assert not d.dropped and d.dispatches
    assert policy.latency.us(d.dispatches[0].variant_id, len(d.dispatches[0].query_ids), "cpu") <= slack


def test_slackfit_yields_below_bucket_zero_to_the_queries_behind():
    """With more queued than the batch below bucket 0 would take, "yield" drops the heads below bucket 0 and
    "serve" serves them."""
    served, yielding = SlackFit(PROFILE, below_buckets="serve"), SlackFit(PROFILE, below_buckets="yield")
    menu = served.menu()
    slack = (menu.fastest_us + menu.buckets[0].latency_us) // 2
    _, batch = menu.choose(slack)
    heads = make_queries(n=batch + 1, slo_us=slack)
    behind = make_queries(n=8, slo_us=10 * menu.buckets[0].latency_us, start_us=0)
    behind = [type(q)(q.deadline_us, q.id + 100, q.seq + 100, q.arrival_us) for q in behind]
    queue = make_queue(heads + behind)
    assert served.decide(0, queue.view(), make_workers(1)).dispatches
    d = yielding.decide(0, queue.view(), make_workers(1))
    assert not d.dispatches and sorted(d.dropped) == [q.id for q in heads]


def test_a_refused_remove_removes_nothing():
    """A list mixing queued and unknown (or repeated) ids raises and leaves every query queued."""
    queue = make_queue(make_queries(4))
    for ids in ([0, 99], [1, 1]):
        with pytest.raises(PolicyError):
            queue.remove(ids)
        assert [q.id for q in queue.scan()] == [0, 1, 2, 3]
