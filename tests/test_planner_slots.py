"""The estimate's wait for a free sequence slot (an M/M/c queue, Erlang C) by hand."""

import math

import pytest

from simulator.planner.estimate import slot_wait


def test_one_slot_is_mm1():
    # a = 0.5: C = rho = 0.5, mean wait rho / (mu - lambda) = 0.5 / 0.5 = 1 s,
    # p99 ln(C / 0.01) / (mu - lambda) = 2 ln 50
    mean, p99 = slot_wait(0.5, 1, 1.0)
    assert mean == pytest.approx(1.0)
    assert p99 == pytest.approx(2 * math.log(50))


def test_two_slots_erlang_c():
    # c = 2, a = 1: B = 0.2, C = 2 x 0.2 / (2 - 0.8) = 1/3, drain 2 - 1 = 1 /s
    mean, p99 = slot_wait(1.0, 2, 1.0)
    assert mean == pytest.approx(1 / 3)
    assert p99 == pytest.approx(math.log(100 / 3))


def test_saturated_and_spare_slots():
    assert slot_wait(2.0, 20, 10.0) == (math.inf, math.inf)  # a = 20 busy of 20
    assert slot_wait(1.0, 100, 10.0) == (0.0, 0.0)  # 90 spare > 4 sqrt(10)
    # a chance of waiting under 1%: a mean wait but no p99 wait
    mean, p99 = slot_wait(1.0, 20, 10.0)
    assert 0 < mean < 0.01 and p99 == 0.0
