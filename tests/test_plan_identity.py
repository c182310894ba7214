"""The plan carries the spec's identity: after planning, the fingerprint needs nothing from the loaded spec."""

from __future__ import annotations

from rasterflow.commands.planjob import fingerprint, plan_command
from rasterflow.spec import load_spec


def test_the_plan_carries_the_spec_digest_and_the_fingerprint_follows_it(write_spec):
    first = load_spec(write_spec("a.yaml", reduce="{method: median}"))
    result = plan_command(first)
    assert result.plan.spec_sha256 == first.sha256 and len(first.sha256) == 64
    job_id = fingerprint(result.plan)
    # same spec, same items: the same identity, read off the plan alone
    assert fingerprint(plan_command(load_spec(first.path)).plan) == job_id
    # another spec text (another statistic) over the same items: another output
    other = load_spec(write_spec("b.yaml", reduce="{method: mean}"))
    other_plan = plan_command(other).plan
    assert other_plan.items == result.plan.items
    assert other_plan.spec_sha256 != first.sha256 and fingerprint(other_plan) != job_id
    # a period's identity is the plan's too, and differs from the whole job's
    assert fingerprint(result.plan, result.plan.items[:1]) != job_id
