"""The register pipeline's order (kernels/skinny_mma.py ``pipeline``) replayed on CPU with ``token_stages``: every
MMA reads the weight and token buffers holding its own stage, each stage is loaded once and consumed in order, and
an order that refills the wrong token buffer is caught."""

import pytest

from skinny_gemm.kernels.config import ConfigError, KernelConfig
from skinny_gemm.kernels.skinny_mma import MMA, TOKEN, WEIGHT, pipeline


def replay(stages, token_stages, trips, order=pipeline):
    """Run the fill, trips - 1 trips and the peeled last trip over register buffers; returns the errors."""
    D, X = stages, token_stages
    first, trip, last = order(D, X)
    wbuf, xbuf, loaded_w, loaded_x, consumed, errors = {}, {}, [], [], [], []
    # each part's stages count from its base: the fill's 0, trip t's t * D, the last trip's (trips - 1) * D
    parts = [(first, 0)] + [(trip, t * D) for t in range(trips - 1)] + [(last, (trips - 1) * D)]
    for ops, base in parts:
        for op, *a in ops:
            if op == WEIGHT:
                wbuf[a[0]] = base + a[1]
                loaded_w.append(base + a[1])
            elif op == TOKEN:
                xbuf[a[0]] = base + a[1]
                loaded_x.append(base + a[1])
            elif op == MMA:
                s = base + a[0]
                if wbuf.get(a[0]) != s or xbuf.get(a[0] % X) != s:
                    errors.append(
                        f"MMA of stage {s}: weight buffer holds {wbuf.get(a[0])}, tokens {xbuf.get(a[0] % X)}"
                    )
                consumed.append(s)
    every = list(range(trips * D))
    if consumed != every or sorted(loaded_w) != every or sorted(loaded_x) != every:
        errors.append(f"stages consumed {consumed}, weight loaded {sorted(loaded_w)}, tokens {sorted(loaded_x)}")
    return errors


CASES = [(d, x, t) for d in (2, 3, 4, 8) for x in range(1, d + 1) if d % x == 0 for t in (1, 2, 3)]


@pytest.mark.parametrize("stages, token_stages, trips", CASES)
def test_every_mma_reads_its_own_stage(stages, token_stages, trips):
    assert replay(stages, token_stages, trips) == []


def test_token_stages_equal_to_stages_is_the_old_order():
    """token_stages = stages (or unset) gives the order every planned cubin was traced from, op for op."""
    for d in (2, 3, 4, 8, 16):
        assert pipeline(d) == pipeline(d, d) == pipeline(d, None)
        first, trip, last = pipeline(d)
        assert last == [(WEIGHT, d - 1, d - 1), (TOKEN, d - 1, d - 1), ("commit",)] + [
            (MMA, j, d - 1 - j) for j in range(d)
        ]


@pytest.mark.parametrize("stages, token_stages", [(4, 2), (8, 2), (8, 4)])
def test_refilling_the_buffer_about_to_be_read_is_caught(stages, token_stages):
    """Negative control: the token refill before MMA j aimed at buffer j % X (the one MMA j reads) instead of the
    one freed a step earlier."""

    def wrong(d, x):
        first, trip, last = pipeline(d, x)
        fix = lambda ops: [(TOKEN, (op[2] - x + 1) % x, op[2]) if op[0] == TOKEN else op for op in ops]  # noqa: E731
        return first, fix(trip), fix(last)

    assert replay(stages, token_stages, 2, wrong)


def test_token_stages_rule_and_registers():
    base = dict(m=16, kind="mma", threads=256, k_threads=256, cols=16, unroll=1, prefetch=False, fetch=0, slices=2)
    full = KernelConfig(stages=4, token_groups=2, **base)
    two = KernelConfig(stages=4, token_groups=2, token_stages=2, **base)
    two.check(n=28672, k=4096)
    # 2 token buffers fewer x 2 loads x 2 groups x 4 words
    assert full.register_rule[0] - two.register_rule[0] == 2 * 16
    assert two.name.endswith("_tg2_ts2") and "token_stages" not in full.to_json()
    for bad in (dict(token_stages=3), dict(token_stages=4), dict(token_stages=2, ring=True)):
        with pytest.raises(ConfigError, match="rule 'token stages'"):
            KernelConfig(stages=4, **{**base, "m": 8, **bad}).check(n=28672, k=4096)
